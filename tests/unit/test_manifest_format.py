"""A manifest's format is one hpc writes: any other (or none) is damage, skipped with a note for the checkpoint
before it, by the store, by the batch script's resume lookup and by merge-weights; a known format of another
strategy is not damage (the load refuses it by name)."""

import json
from pathlib import Path

import pytest

from hpc.errors import HpcError
from hpc.runtime.checkpoint import formats, manifest, merge, script_resume
from hpc.runtime.checkpoint.store import CheckpointStore


def commit(folder: Path, step: int, fmt="full") -> Path:
    folder.mkdir(parents=True)
    (folder / "model_0.pt").write_bytes(bytes([step]) * 100)
    meta = {"step": step} if fmt is None else {"step": step, "format": fmt}
    manifest.commit(folder, {"model_0.pt": manifest.file_entry(folder / "model_0.pt")}, meta, fsync=False)
    return folder


UNKNOWN = [("zarr", "its format is 'zarr', not one hpc writes (full, dcp, deepspeed)"), (None, "names no format"),
           (3, "its format is 3"), ("", "its format is ''"), ("FULL", "its format is 'FULL'")]


def test_the_formats_named_are_the_ones_formats_py_writes():
    assert set(manifest.FORMATS) == {f.name for f in (formats.FullFormat, formats.DcpFormat, formats.DeepSpeedFormat)}


@pytest.mark.parametrize(("fmt", "said"), UNKNOWN)
def test_an_unknown_format_is_damage_and_the_checkpoint_before_is_taken(tmp_path, fmt, said):
    commit(tmp_path / "step-4", 4)
    commit(tmp_path / "step-8", 8, fmt=fmt)
    problem = manifest.check(tmp_path / "step-8", manifest.read(tmp_path / "step-8"))
    assert problem is not None and "manifest.json is malformed" in problem and said in problem, problem
    skipped = []
    good = CheckpointStore(tmp_path).newest_good(skipped=lambda entry, why: skipped.append(entry.step))
    assert good.step == 4 and skipped == [8]


@pytest.mark.parametrize("fmt", ["dcp", "deepspeed"])
def test_a_known_format_of_another_strategy_is_not_damage(tmp_path, fmt):
    commit(tmp_path / "step-8", 8, fmt=fmt)
    assert manifest.check(tmp_path / "step-8", manifest.read(tmp_path / "step-8")) is None


@pytest.mark.parametrize("spoil", [{"format": "zarr"}, {"step": "two"}, {"loaders": "all"}, {"world_size": -1}],
                         ids=lambda d: next(iter(d)))
def test_the_batch_scripts_resume_lookup_skips_a_malformed_manifest(tmp_path, capsys, spoil):
    """It checked the checksums alone: a malformed manifest went to the script, whose load_state then stopped the
    job on it instead of resuming from the checkpoint before."""
    job = tmp_path / "job"
    (job / "tasks").mkdir(parents=True)
    for step in (2, 4):
        script_resume.note(job, "0", commit(tmp_path / "out" / f"step_{step}", step), step)
    newest = tmp_path / "out" / "step_4" / manifest.NAME
    newest.write_text(json.dumps({**json.loads(newest.read_text()), **spoil}))
    assert script_resume.newest(job, "0") == tmp_path / "out" / "step_2"
    said = capsys.readouterr().err
    assert "not resuming from step_4: " in said and "manifest.json is malformed" in said


def test_merge_weights_of_an_unknown_format_is_one_line(tmp_path):
    folder = commit(tmp_path / "step-8", 8, fmt="zarr")
    with pytest.raises(HpcError) as err:
        merge.model_weights(folder)
    assert "cannot merge" in str(err.value) and "not one hpc writes" in str(err.value)

