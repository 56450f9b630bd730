"""Batch-inference jobs in one process: chunks committed whole, skipped on resume, stopped by signals between
chunks, refused when the output folder disagrees; and the shares of ranks and array tasks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc.cluster.backends.base import LocalFiles, items_progress
from hpc.contract import batch_outputs as names
from hpc.errors import HpcError
from hpc.runtime.inference.batch import chunk_files, sharding

WORKER = Path(__file__).parents[1] / "batch_worker.py"
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "HPC_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}


def run_worker(spec: dict, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(WORKER), json.dumps(spec)], capture_output=True, text=True,
                          env={**CLEAN_ENV, **(env or {})}, timeout=60, **kwargs)


def outputs(out: Path) -> dict[int, object]:
    got = {}
    for i, value in chunk_files.read_outputs(out):
        assert i not in got
        got[i] = value
    return got


def expected(n: int) -> dict[int, dict]:
    return {i: {"i": i, "square": i * i, "text": f"item-{i}"} for i in range(n)}


def ledger_chunks(path: Path) -> list[int]:
    return [int(line.split()[3]) for line in path.read_text().splitlines()]


# --- the job's shape -----------------------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [((-1, 8, "jsonl"), "num_items is -1"), ((10, 0, "jsonl"), "chunk_size is 0"),
                                         ((10, 2.5, "jsonl"), "chunk_size must be a whole number"),
                                         ((True, 2, "jsonl"), "num_items must be"),
                                         ((10, 2, "csv"), "unknown output format 'csv'")])
def test_a_bad_shape_is_one_line_naming_the_argument(args, words):
    with pytest.raises(HpcError, match=words):
        names.checked_spec(*args)


def test_chunks_cover_the_items_once_and_the_last_is_short():
    spec = names.checked_spec(10, 4, "jsonl")
    assert spec.num_chunks == 3
    assert [list(spec.items_of(c)) for c in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert names.checked_spec(0, 4, "jsonl").num_chunks == 0


# --- shares --------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(chunks=st.integers(0, 200), tasks=st.integers(1, 7), world=st.integers(1, 9),
       done=st.sets(st.integers(0, 199)))
def test_every_pending_chunk_goes_to_exactly_one_rank_of_one_task(chunks, tasks, world, done):
    dealt = []
    for task in range(tasks):
        place = sharding.ArrayPlace(task, tasks)
        pending = [c for c in range(chunks) if place.owns(c) and c not in done]
        shares = [sharding.deal(pending, r, world) for r in range(world)]
        assert max(map(len, shares)) - min(map(len, shares)) <= 1  # what is left is spread evenly
        dealt += [c for share in shares for c in share]
    assert sorted(dealt) == [c for c in range(chunks) if c not in done]


@pytest.mark.parametrize("env, place", [
    ({}, (0, 1)),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_MAX": "9",
      "SLURM_ARRAY_TASK_COUNT": "5"}, (2, 5)),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "8",
      "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "5"}, (2, 5))])
def test_an_array_tasks_place_comes_from_slurms_variables(monkeypatch, env, place):
    for k in [k for k in os.environ if k.startswith("SLURM_ARRAY")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert sharding.array_place() == sharding.ArrayPlace(*place)


def test_an_unevenly_spaced_array_must_say_its_split(monkeypatch):
    for k, v in {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "7",
                 "SLURM_ARRAY_TASK_COUNT": "3"}.items():  # --array 1,5,7
        monkeypatch.setenv(k, v)
    with pytest.raises(HpcError, match="unevenly spaced.*pass task= and num_tasks="):
        sharding.array_place()
    assert sharding.array_place(1, 3) == sharding.ArrayPlace(1, 3)
    with pytest.raises(HpcError, match="together"):
        sharding.array_place(1, None)
    with pytest.raises(HpcError, match="no place in an array"):
        sharding.array_place(3, 3)


# --- chunk files ---------------------------------------------------------------------------------------
def test_a_chunk_counts_only_once_committed_with_the_size_its_commit_names(tmp_path):
    spec = names.checked_spec(10, 4, "jsonl")
    (tmp_path / names.CHUNKS).mkdir()
    for c in range(3):
        chunk_files.commit(tmp_path, spec, c, [c] * len(spec.items_of(c)), "a", 0)
    assert sorted(names.committed(tmp_path, spec)) == [0, 1, 2]
    data = tmp_path / names.CHUNKS / names.data_name(1, "jsonl")
    data.write_bytes(data.read_bytes()[:-3])  # cut short behind the commit's back
    (tmp_path / names.CHUNKS / names.commit_name(2)).unlink()  # written, never committed
    (tmp_path / names.CHUNKS / f".{names.data_name(3, 'jsonl')}.tmp1-ab").write_text("half")  # a crash's temp
    assert sorted(names.committed(tmp_path, spec)) == [0]
    assert names.items_done(spec, [0]) == 4


def test_changed_data_of_the_committed_size_is_refused_on_read(tmp_path):
    spec = names.checked_spec(4, 4, "jsonl")
    (tmp_path / names.CHUNKS).mkdir()
    (tmp_path / names.SPEC).write_text(json.dumps(spec.as_dict()))
    chunk_files.commit(tmp_path, spec, 0, [1, 2, 3, 4], "a", 0)
    assert [v for _, v in chunk_files.read_outputs(tmp_path)] == [1, 2, 3, 4]
    data = tmp_path / names.CHUNKS / names.data_name(0, "jsonl")
    data.write_text(data.read_text().replace("3", "7"))
    with pytest.raises(HpcError, match="does not match its commit"):
        list(chunk_files.read_outputs(tmp_path))


def test_an_output_per_item_or_a_loud_error(tmp_path):
    spec = names.checked_spec(10, 4, "jsonl")
    (tmp_path / names.CHUNKS).mkdir()
    with pytest.raises(HpcError, match=r"chunk 2 holds items 8\.\.9 \(2\), but 3 outputs"):
        chunk_files.commit(tmp_path, spec, 2, [1, 2, 3], "a", 0)
    with pytest.raises(HpcError, match="cannot be written as JSON"):
        chunk_files.commit(tmp_path, spec, 2, [object(), 1], "a", 0)
    assert names.committed(tmp_path, spec) == {}


def test_pt_outputs_keep_tensors_and_load_without_pickles(tmp_path):
    spec = names.checked_spec(3, 2, "pt")
    (tmp_path / names.CHUNKS).mkdir()
    (tmp_path / names.SPEC).write_text(json.dumps(spec.as_dict()))
    chunk_files.commit(tmp_path, spec, 0, [torch.arange(3), {"logits": torch.ones(2)}], "a", 0)
    chunk_files.commit(tmp_path, spec, 1, [torch.tensor([1.5])], "a", 0)
    got = dict(chunk_files.read_outputs(tmp_path))
    assert torch.equal(got[0], torch.arange(3)) and torch.equal(got[1]["logits"], torch.ones(2))
    assert torch.equal(got[2], torch.tensor([1.5]))


def test_reading_an_unfinished_output_needs_partial(tmp_path):
    spec = names.checked_spec(8, 4, "jsonl")
    (tmp_path / names.CHUNKS).mkdir()
    (tmp_path / names.SPEC).write_text(json.dumps(spec.as_dict()))
    chunk_files.commit(tmp_path, spec, 1, [4, 5, 6, 7], "a", 0)
    with pytest.raises(HpcError, match="1 of 2 chunks are not committed"):
        list(chunk_files.read_outputs(tmp_path))
    assert list(chunk_files.read_outputs(tmp_path, partial=True)) == [(4, 4), (5, 5), (6, 6), (7, 7)]
    with pytest.raises(HpcError, match="holds no batch-inference outputs"):
        list(chunk_files.read_outputs(tmp_path / "elsewhere"))


# --- progress, as hpc status reads it -------------------------------------------------------------------
def test_status_sums_the_tasks_start_and_their_ranks_commits_of_this_attempt(tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "0.items").write_text(json.dumps({"attempt": "b", "done": 40, "total": 100}))
    (tasks / "0.items-r0").write_text("b 8\n")
    (tasks / "0.items-r1").write_text("b 4\n")
    (tasks / "0.items-r2").write_text("a 30\n")  # a rank of the attempt before: counted in "done" already
    (tasks / "1.items").write_text(json.dumps({"attempt": "c", "done": 0, "total": 100}))
    (tasks / "1.items-r0").write_text("c 1")
    (tasks / "2.items").write_text("{cut sh")  # a task's file mid-write elsewhere: not counted
    assert items_progress(LocalFiles(tmp_path)) == {"done": 53, "total": 200}
    assert items_progress(LocalFiles(tmp_path / "none")) is None
