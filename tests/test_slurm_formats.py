"""hpc's hostlist parsing agrees with SLURM's own (`scontrol show hostnames`) on the real cluster."""

import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc.slurm.hostlist import compress, expand

pytestmark = pytest.mark.slurm


def scontrol_hostnames(text: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.parametrize("text", [
    "node1", "node[1-3]", "node[001-004,7],gpu-a[1-2]", "node[8-11]", "a[01-3]", "rack[1-2]-n[01-02]",
    "login,node1.ib", "nid[000001-001024]", "x[0-0]", "n[1,3,5-7,10-12]",
])
def test_expand_matches_scontrol(slurm, text):
    assert expand(text) == scontrol_hostnames(text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["node", "gpu-a", "cn"]), st.integers(0, 500), st.sampled_from([0, 3]),
                          st.sampled_from(["", ".ib"])),
                min_size=1, max_size=30))
def test_compressed_lists_expand_alike_in_slurm(slurm, parts):
    hosts = [f"{prefix}{str(n).zfill(width)}{suffix}" for prefix, n, width, suffix in parts]
    text = compress(hosts)
    assert sorted(scontrol_hostnames(text)) == sorted(set(hosts)) == sorted(expand(text))
