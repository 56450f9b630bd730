"""Checkpoints: the commit protocol, damage detection and purge, in this process (crash safety and bitwise-equal
resumes in training processes: tests/test_checkpoint.py)."""

from pathlib import Path

import torch

from hpc.runtime.checkpoint import fileset, manifest
from hpc.runtime.checkpoint.fileset import FileSet
from hpc.runtime.checkpoint.store import CheckpointStore


def _commit_folder(folder: Path, step: int) -> None:
    folder.mkdir(parents=True)
    files = FileSet(folder, 0)
    files.save("model_0.pt", {"w": torch.full((64,), float(step))})
    files.finish()
    manifest.commit(folder, fileset.collect(folder, 1), {"step": step, "format": "full"})
    fileset.clear_sums(folder, 1)


def test_manifest_lists_every_file_and_catches_corruption_and_truncation(tmp_path):
    folder = tmp_path / "step-1"
    _commit_folder(folder, 1)
    (folder / "extra").mkdir()
    data = manifest.read(folder)
    assert sorted(data["files"]) == ["model_0.pt"] and not list(folder.glob(".sums*"))
    assert manifest.verify(folder, data["files"]) is None
    path = folder / "model_0.pt"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert "checksum" in manifest.verify(folder, data["files"])
    path.write_bytes(bytes(raw[:-10]))
    assert "truncated" in manifest.verify(folder, data["files"])


def test_a_folder_without_manifest_is_not_a_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path)
    _commit_folder(tmp_path / "step-3", 3)
    (tmp_path / "step-7").mkdir()
    (tmp_path / "step-7" / "model_0.pt").write_bytes(b"half")
    assert [e.step for e in store.committed()] == [3]
    (tmp_path / "step-9").mkdir()
    (tmp_path / "step-9" / manifest.NAME).write_text('{"files": ')  # a torn manifest
    assert [e.step for e in store.committed()] == [3]


def test_purge_keeps_the_newest_k_and_clears_cut_short_saves_below_them(tmp_path):
    for step in (1, 2, 3, 4, 5):
        _commit_folder(tmp_path / f"step-{step}", step)
    (tmp_path / "step-0").mkdir()  # cut short, older than the newest commit: debris
    (tmp_path / "step-6").mkdir()  # newer than every commit: left for the save that will reach step 6
    store = CheckpointStore(tmp_path, keep=1)  # asked for 1; 2 is the floor
    assert store.keep == 2
    store.purge()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-4", "step-5", "step-6"]
