"""N-D parallelism on 4 CPU ranks (gloo): a small transformers Llama, built plainly and given to prepare(), trained
with tensor parallelism (its own tp_plan, applied by hpc) x FSDP2, with HSDP, and with context parallelism (each
sequence split over 2 ranks, beside FSDP or tensor parallelism), from Accelerate's ParallelismConfig. Every mesh
takes the same global batch as DDP and must give DDP's losses, with clipped gradients; checkpoints move between
meshes through DCP; merge-weights writes one file of them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.jobhelpers import launch_env

WORKER = Path(__file__).parent / "nd_worker.py"
MESHES = {"ddp": None, "tp2 x dp_shard2": {"tp_size": 2, "dp_shard_size": 2},
          "hsdp 2 x 2": {"dp_replicate_size": 2, "dp_shard_size": 2},
          "cp2 x dp_shard2": {"cp_size": 2, "dp_shard_size": 2}, "cp2 x tp2": {"cp_size": 2, "tp_size": 2}}
SHARDS = {"tp2 x dp_shard2": 4, "hsdp 2 x 2": 2, "cp2 x dp_shard2": 4, "cp2 x tp2": 4}


def _launch(folder: Path, spec: dict) -> dict:
    spec = {"project": str(folder / "project"), "global_batch": 8, "steps": 3, "clip": 0.05, **spec}
    cmd = [sys.executable, "-m", "hpc", "launch", "--nproc", "4", str(WORKER), json.dumps(spec)]
    done = subprocess.run(cmd, cwd=folder, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(spec["out"])


def _train(tmp_path_factory, name: str) -> tuple[dict, Path]:
    folder, mesh = tmp_path_factory.mktemp(name.replace(" ", "")), MESHES[name]
    spec = {"out": str(folder / "out.pt"), "save": str(folder / "saved")} | ({"mesh": mesh} if mesh else {})
    return _launch(folder, spec), folder


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """Plain DDP alone: the SLURM test needs only its losses, and it runs on the SLURM worker (tests/conftest.py),
    which would otherwise train every mesh again (~3 minutes on the suite's longest path)."""
    return _train(tmp_path_factory, "ddp")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ddp):
    return {"ddp": ddp} | {name: _train(tmp_path_factory, name) for name in MESHES if name != "ddp"}


@pytest.mark.parametrize("name", list(SHARDS))
def test_each_mesh_trains_as_ddp_on_the_same_global_batch(runs, name):
    ddp, mesh = runs["ddp"][0], runs[name][0]
    assert len(mesh["losses"]) == 3
    torch.testing.assert_close(torch.tensor(mesh["losses"]), torch.tensor(ddp["losses"]), rtol=1e-4, atol=0)
    # the gradients were clipped (0.05 is far below their norm), over every mesh's shards alike
    # each rank holds its share: a quarter under tp 2 x dp_shard 2 (norms are cut over dp_shard only), a half under
    # HSDP, whose dp_replicate ranks hold the same shards; FSDP shards over cp's ranks too (dp_shard x cp)
    total, shards = mesh["total"], SHARDS[name]
    assert sum(mesh["held"]) >= total and max(mesh["held"]) < total / shards * 1.05, mesh["held"]


@pytest.mark.slurm
def test_accelerates_parallelism_flags_train_a_cp_mesh_as_a_slurm_job(slurm, ddp, tmp_path):
    """The user's way in: `hpc submit --parallelism_config_cp_size 2 --parallelism_config_dp_shard_size 2` on 2
    nodes x 2 ranks; the script's Accelerator() builds its ParallelismConfig from the variables the job exports."""
    from tests.jobhelpers import hpc

    spec = {"project": str(tmp_path / "project"), "global_batch": 8, "steps": 3, "clip": 0.05,
            "out": str(tmp_path / "out.pt")}
    proc = hpc(tmp_path, "submit", "-p", "slurm-local", "-N", "2", "--no-snapshot", "--parallelism_config_cp_size",
               "2", "--parallelism_config_dp_shard_size", "2", "--wait", str(WORKER), json.dumps(spec), timeout=300)
    assert proc.returncode == 0, proc.stderr + hpc(tmp_path, "logs", "--all").stdout[-3000:]
    found = torch.load(tmp_path / "out.pt")
    torch.testing.assert_close(torch.tensor(found["losses"]), torch.tensor(ddp[0]["losses"]), rtol=1e-4, atol=0)
    assert max(found["held"]) < found["total"] / 4 * 1.05, found["held"]


def test_a_context_parallel_checkpoint_loads_under_plain_fsdp(runs, tmp_path):
    trained, folder = runs["cp2 x dp_shard2"]
    there = _launch(tmp_path, {"mesh": {"dp_shard_size": 4}, "load": str(folder / "saved"), "steps": 0,
                               "out": str(tmp_path / "dp4.pt")})
    for name, weight in trained["weights"].items():
        assert torch.equal(there["weights"][name], weight), name


def test_a_checkpoint_moves_between_meshes_and_merges_into_one_file(runs, tmp_path):
    trained, folder = runs["tp2 x dp_shard2"]
    there = _launch(tmp_path, {"mesh": {"dp_shard_size": 4}, "load": str(folder / "saved"), "steps": 0,
                               "out": str(tmp_path / "dp4.pt"), "save": str(tmp_path / "dp4")})
    # back into a model that comes tensor-parallel already (transformers' tp_plan="auto"): its plan not applied twice
    back = _launch(tmp_path, {"mesh": {"tp_size": 2, "dp_shard_size": 2}, "load": str(tmp_path / "dp4"),
                              "steps": 0, "out": str(tmp_path / "back.pt"), "project": str(tmp_path / "p2"),
                              "pre_tp": True})
    for name, weight in trained["weights"].items():
        assert torch.equal(there["weights"][name], weight), name
        assert torch.equal(back["weights"][name], weight), name
    merged = subprocess.run([sys.executable, "-m", "hpc", "merge-weights", str(folder / "saved")], cwd=tmp_path,
                            env=launch_env(), capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    assert f"{trained['total']:,} parameters" in merged.stdout + merged.stderr
