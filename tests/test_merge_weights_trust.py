"""`hpc merge-weights` on checkpoints another user could have written, as a subprocess: DCP is read without
unpickling (a planted .metadata is refused in one line), a DeepSpeed checkpoint needs --trust-pickles, and the
merge writes through no predictable temporary name. (The in-process trust checks are tests/unit's.)"""

import subprocess
import sys
from pathlib import Path

import torch

from hpc.runtime.checkpoint import manifest
from tests.jobhelpers import launch_env
from tests.unit.test_checkpoint_trust import Planted, _plant


def _merge(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc", "merge-weights", *map(str, args)], env=launch_env(),
                          capture_output=True, text=True, timeout=120, check=False)


def _dcp_checkpoint(folder: Path) -> dict:
    """A one-process DCP checkpoint as FSDP writes it (model and optimizer state), committed."""
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    dcp.save({"model_0": model.state_dict(), "optimizer_0": opt.state_dict()}, checkpoint_id=str(folder / "dcp"),
             no_dist=True)
    files = {p.relative_to(folder).as_posix(): manifest.file_entry(p) for p in (folder / "dcp").iterdir()}
    manifest.commit(folder, files, {"step": 1, "format": "dcp"}, fsync=False)
    return weights


def test_merge_weights_reads_dcp_without_unpickling_and_refuses_a_planted_metadata(tmp_path):
    weights = _dcp_checkpoint(tmp_path / "checkpoints" / "step-1")
    # the old predictable temporary name, planted as a link to a victim: the merge writes nowhere near it
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "merged.pt"
    (tmp_path / ".merged.pt.tmp").symlink_to(victim)
    proc = _merge(tmp_path, "--format", "torch", "-o", out)
    assert proc.returncode == 0, proc.stderr
    merged = torch.load(out, weights_only=True)
    assert merged.keys() == weights.keys() and all(torch.equal(merged[k], weights[k]) for k in weights)
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".merged.pt.tmp", "checkpoints", "merged.pt", "victim"]

    folder, marker = tmp_path / "checkpoints" / "step-1", tmp_path / "marker"
    _plant(folder, "dcp/.metadata", marker, raw_pickle=True)
    refused = _merge(folder, "-o", tmp_path / "x.safetensors")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert ".metadata" in refused.stderr and "--trust-pickles" in refused.stderr, refused.stderr
    assert not marker.exists() and not (tmp_path / "x.safetensors").exists()


def test_merge_weights_refuses_a_deepspeed_checkpoint_without_trust_pickles(tmp_path):
    folder, marker = tmp_path / "step-4", tmp_path / "marker"
    (folder / "deepspeed" / "state").mkdir(parents=True)
    torch.save({"module": Planted(marker)}, folder / "deepspeed" / "state" / "mp_rank_00_model_states.pt")
    name = "deepspeed/state/mp_rank_00_model_states.pt"
    manifest.commit(folder, {name: manifest.file_entry(folder / name)}, {"step": 4, "format": "deepspeed"},
                    fsync=False)
    proc = _merge(folder, "-o", tmp_path / "x.safetensors")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "DeepSpeed" in proc.stderr and "--trust-pickles" in proc.stderr, proc.stderr
    assert not marker.exists() and not (tmp_path / "x.safetensors").exists()


