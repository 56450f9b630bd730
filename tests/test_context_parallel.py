"""Context parallelism's attention on 2 CPU ranks (gloo), where hpc's gathered attention stands in for torch's
CUDA-only ring: the split sequence attends as the whole one does (outputs and gradients, causal or not, grouped
keys), and what would attend wrongly stops in one line. Training under cp meshes: tests/test_nd_parallel.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobhelpers import launch_env

WORKER = Path(__file__).parent / "cp_attention_worker.py"


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cp")
    cmd = [sys.executable, "-m", "hpc", "launch", "--nproc", "2", str(WORKER), str(folder / "found.json")]
    done = subprocess.run(cmd, cwd=folder, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "found.json").read_text())


@pytest.mark.parametrize("case", ["gqa causal", "mha causal", "mha full"])
def test_the_split_sequence_attends_as_the_whole_one(found, case):
    assert found[case] < 1e-5, found[case]


def test_each_rank_knows_its_place_on_the_mesh(found):
    assert found["cp ranks"] == [0, 1] and found["ranks"] == [0, 0]


def test_the_positions_handed_to_the_model_are_those_torchs_ring_split_gives(found):
    assert found["torch's cut"] is True


def test_what_would_attend_wrongly_stops_in_one_line(found):
    assert "an attention mask reached scaled_dot_product_attention" in found["mask"]
    assert "without calling scaled_dot_product_attention" in found["no attention"]
    assert "backward() after the maybe_context_parallel block that ran the forward had closed" in found["late backward"]
    assert "\n" not in found["mask"] + found["no attention"] + found["late backward"]
