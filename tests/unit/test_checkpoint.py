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


def test_a_part_written_as_rank_0_replaces_its_folder_is_written_again_into_the_new_one(tmp_path, monkeypatch):
    """Rank 0 saves a damaged step again (a new folder swapped in for the old) while rank 1 writes its part: rank
    1's random streams went with the old folder, or its listing found its place gone and the rank crashed (a test
    of the suite failed so, once). The part is written again into the new folder once rank 0 has committed it."""
    import types

    folder = tmp_path / "step-10"
    folder.mkdir()
    publish, swapped = fileset.publish_part, []

    def racing(where, rank, sums, at, fsync=False):
        if not swapped:  # rank 0's swap, between the part's files and its listing
            swapped.append(True)
            where.rename(tmp_path / ".step-10.replaced")
            where.mkdir()
            manifest.commit(where, {}, {"step": 10, "micro_step": 10}, fsync=False)
        return publish(where, rank, sums, at, fsync)

    monkeypatch.setattr(fileset, "publish_part", racing)
    fileset.write_part(folder, 1, {"rng/rank1.pt": torch.arange(3)}, types.SimpleNamespace(write=lambda f, files: None),
                       (10, 10), False, 5.0)
    part = fileset.read_part(folder, 1)
    assert part is not None and manifest.verify(folder, part["files"]) is None
    assert torch.equal(torch.load(folder / "rng" / "rank1.pt", weights_only=True), torch.arange(3))
