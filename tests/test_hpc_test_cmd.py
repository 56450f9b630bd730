"""`hpc test`: a real sanity job on the local profile and on the on-machine SLURM cluster, and a real failure (bad
input and the cross-rank verdict on hand-written rank files: tests/unit/test_hpc_test_cmd.py)."""

import json
import re

import pytest

from tests.jobhelpers import hpc
from tests.unit.test_hpc_test_cmd import CHECKS


def test_local_two_processes_pass(tmp_path):
    proc = hpc(tmp_path, "test", "-p", "local", "--nproc", "2", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == ["ok"] * len(CHECKS)
    assert "ranks 0-1 on 1 host(s)" in proc.stdout and "gloo on cpu" in proc.stdout
    assert lines[-1].startswith("hpc test: passed (world 2 on 1 node, ")
    assert "waiting for it to end" in proc.stderr


def test_json_gives_every_check_and_one_process_needs_no_group(tmp_path):
    proc = hpc(tmp_path, "test", "--json", timeout=120, env={"HPC_PROFILE": "local"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert [c["name"] for c in data["checks"]] == CHECKS and all(c["ok"] for c in data["checks"])
    assert (data["passed"], data["failed"], data["world"], data["profile"]) == (True, None, 1, "local")
    assert data["checks"][2]["detail"] == "none needed (one process) on cpu"
    assert data["logs"].startswith(str(tmp_path / "hpc-jobs" / "hpc-test-"))


def test_a_network_interface_that_does_not_exist_fails_the_process_group(tmp_path):
    # A real failure, the commonest multi-node one: the profile names a NIC the nodes do not have, so gloo
    # cannot form the process group. Nothing here is faked; the job fails as it would on a cluster.
    (tmp_path / "badnic.yaml").write_text("extends: local\nname: badnic\nnetwork_interface: nosuchnic0\n")
    proc = hpc(tmp_path, "test", "-p", "./badnic.yaml", "--nproc", "2", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = proc.stdout.splitlines()[-1]
    assert verdict.startswith("hpc test: FAILED: process group: rank "), verdict
    assert "nosuchnic0" in verdict and f"; logs: {tmp_path}/hpc-jobs/hpc-test-" in verdict
    assert "ok    world size" in proc.stdout and "FAIL  job ended              FAILED (exit 1)" in proc.stdout


@pytest.mark.slurm
def test_two_nodes_on_the_slurm_cluster_pass(slurm, tmp_path):
    # others share the cluster: hpc test's own timeout (which cancels the job) comes before the subprocess's
    proc = hpc(tmp_path, "test", "-p", "slurm-local", "-N", "2", "--nproc", "1", "--timeout", "240", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"ranks 0-1 on 2 host\(s\): node\d, node\d\n", proc.stdout), proc.stdout  # others use nodes too
    assert proc.stdout.splitlines()[-1].startswith("hpc test: passed (world 2 on 2 nodes, ")
