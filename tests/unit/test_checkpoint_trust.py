"""Checkpoints are verified before they are trusted, and never unpickled (issue 22, "Trust on a shared cluster"):
retention, malformed manifests, scheduler states and `hpc merge-weights`, in this process. A planted pickle,
a malformed manifest or a damaged final checkpoint in a training process: tests/test_checkpoint_trust.py.
"""

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from hpc.errors import HpcError
from hpc.runtime.checkpoint import manifest, merge, safe_load
from hpc.runtime.checkpoint.store import CheckpointStore


class Planted:
    """What a hostile user writes into a checkpoint: unpickling it creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _plant(folder: Path, name: str, marker: Path, raw_pickle: bool = False) -> None:
    """Replace ``name`` with a hostile pickle and give it a matching manifest entry, as the folder's other
    writers could."""
    path = folder / name
    if raw_pickle:
        path.write_bytes(pickle.dumps(Planted(marker)))
    else:
        torch.save({"state": Planted(marker)}, path)
    _rehash(folder)


def _rehash(folder: Path) -> None:
    data = manifest.read(folder)
    data["files"] = {name: manifest.file_entry(folder / name) for name in data["files"]}
    manifest.write_json_atomic(folder / manifest.NAME, data, fsync=False)


# --- retention, manifests, schedulers: in this process ---------------------------------------------------------
def _commit(folder: Path, step: int) -> None:
    folder.mkdir(parents=True)
    torch.save({"w": torch.full((8,), float(step))}, folder / "model_0.pt")
    manifest.commit(folder, {"model_0.pt": manifest.file_entry(folder / "model_0.pt")},
                    {"step": step, "format": "full"}, fsync=False)


def test_a_damaged_checkpoint_does_not_count_among_the_kept(tmp_path):
    for step in (4, 8, 12):
        _commit(tmp_path / f"step-{step}", step)
    _commit(tmp_path / "step-16", 16)
    store = CheckpointStore(tmp_path, keep=2)
    # step-12 was found damaged: the two kept are 16 and 8, and the damaged one below the newest goes
    store.purge(damaged=frozenset({tmp_path / "step-12"}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-16", "step-8"]
    # a damaged newest is kept aside (it is saved again when training reaches it), not counted
    _commit(tmp_path / "step-20", 20)
    store.purge(damaged=frozenset({tmp_path / "step-20"}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-16", "step-20", "step-8"]


@pytest.mark.parametrize("spoil,said", [
    (lambda d: {**d, "files": ["model_0.pt"]}, "files is a list, not a mapping"),
    (lambda d: {**d, "files": {"model_0.pt": {"size": "9"}}}, "the entry of model_0.pt is not {size, crc32}"),
    (lambda d: {**d, "files": {"../../etc/passwd": {"size": 1, "crc32": "00000000"}}}, "not a path inside"),
    (lambda d: {**d, "step": -1}, "its step is -1, not a count"),
])
def test_malformed_manifest_shapes_are_named_not_raised(tmp_path, spoil, said):
    _commit(tmp_path / "step-1", 1)
    folder = tmp_path / "step-1"
    data = spoil(manifest.read(folder))
    (folder / manifest.NAME).write_text(json.dumps(data))
    problem = manifest.check(folder, manifest.read(folder))
    assert problem is not None and said in problem and "\n" not in problem, problem
    assert CheckpointStore(tmp_path).newest_good() is None


def test_scheduler_and_scaler_states_load_under_weights_only(tmp_path):
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s),
                  torch.optim.lr_scheduler.MultiplicativeLR(opt, lambda s: 0.9),
                  torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10),
                  torch.optim.lr_scheduler.CyclicLR(opt, 0.01, 0.1),
                  torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
                  torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, 3)]
    states = [s.state_dict() for s in schedulers] + [torch.amp.GradScaler("cpu").state_dict()]
    for i, state in enumerate(states):
        torch.save(state, tmp_path / f"s{i}.pt")
        assert safe_load.load(tmp_path / f"s{i}.pt").keys() == state.keys(), i


def test_merge_resolves_past_a_damaged_newest_checkpoint(tmp_path, capsys):
    for step in (1, 2):
        _commit(tmp_path / "checkpoints" / f"step-{step}", step)
    (tmp_path / "checkpoints" / "step-2" / "model_0.pt").write_bytes(b"short")
    assert merge.resolve(tmp_path) == tmp_path / "checkpoints" / "step-1"
    assert "skipping damaged checkpoint step-2" in capsys.readouterr().err
    (tmp_path / "checkpoints" / "step-1" / "model_0.pt").write_bytes(b"short")
    with pytest.raises(HpcError, match="every committed checkpoint is damaged"):
        merge.resolve(tmp_path)


def test_save_model_and_merge_write_through_no_predictable_name(tmp_path):
    from hpc.runtime.checkpoint import model_files

    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("model.safetensors", "w.safetensors"):
        (out / f".{name}.tmp").symlink_to(victim)
        (out / f".{name}.tmp{os.getpid()}").symlink_to(victim)
    weights = {"a": torch.ones(3)}
    model_files.write(weights, out)
    merge.write(weights, out / "w.safetensors", "safetensors")
    assert victim.read_text() == "precious"
    assert {p.name for p in out.iterdir() if not p.is_symlink()} == {"model.safetensors", "w.safetensors"}
