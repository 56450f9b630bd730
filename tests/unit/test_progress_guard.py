"""No progress, no endless requeue: what each attempt notes of its committed progress, and the verdict the batch
script asks for before a requeue (torch-free, but for one run through the real writers)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.contract import layout
from hpc.runtime.resilience import progress_guard

GUARD = [sys.executable, "-m", "hpc.runtime.resilience.progress_guard"]


def progress_file(job: Path, task: str = "0") -> Path:
    return Path(layout.JobFolder(job).task(task, layout.TaskFile.PROGRESS))


def job_with(tmp_path: Path, text: str, task: str = "0") -> Path:
    job = tmp_path / "job"
    (job / layout.TASKS).mkdir(parents=True, exist_ok=True)
    progress_file(job, task).write_text(text)
    return job


@pytest.fixture
def in_job(tmp_path, monkeypatch):
    job = tmp_path / "job"
    (job / layout.TASKS).mkdir(parents=True)
    for key in ("SLURM_RESTART_COUNT", "HPC_RESTART_COUNT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HPC_JOB_DIR", str(job))
    monkeypatch.setenv("HPC_TASK", "3")
    monkeypatch.setattr(progress_guard, "_done_noted", set())
    return job


# --- the verdict ---------------------------------------------------------------------------------------
def test_an_attempt_that_committed_a_newer_checkpoint_lets_the_job_run_again(tmp_path):
    job = job_with(tmp_path, "0 10\n0 20\n1 20\n2 20\n3 30\n")
    assert progress_guard.verdict(job, "0", 3, 3) is None
    assert progress_guard.verdict(job, "0", 4, 3) is None  # attempt 3 is among the last three
    assert progress_guard.verdict(job, "0", 5, 3) is None
    assert progress_guard.verdict(job, "0", 6, 3) == (
        "no progress over the last 3 attempts (4-6): the newest checkpoint is still step 30, committed in attempt 3")


def test_checkpoints_saved_again_at_the_same_step_are_no_progress(tmp_path):
    # attempts 2-4 resumed from step 40 and saved it again (or an older one): the job goes nowhere
    job = job_with(tmp_path, "0 20\n1 40\n2 40\n3 30\n3 40\n4 40\n")
    assert progress_guard.verdict(job, "0", 4, 3) == (
        "no progress over the last 3 attempts (2-4): the newest checkpoint is still step 40, committed in attempt 1")
    assert progress_guard.verdict(job, "0", 3, 3) is None  # attempt 1 is still among the last three


def test_an_attempt_with_no_notes_made_no_progress(tmp_path):
    job = job_with(tmp_path, "0 5\n")
    assert progress_guard.verdict(job, "0", 2, 3) is None  # attempt 0 progressed
    assert "still step 5, committed in attempt 0" in progress_guard.verdict(job, "0", 3, 3)
    empty = tmp_path / "empty"  # no progress file at all (nothing ever committed)
    assert progress_guard.verdict(empty, "0", 1, 3) is None  # fewer than K attempts have run
    assert progress_guard.verdict(empty, "0", 2, 3) == (
        "no progress over the last 3 attempts (0-2): no checkpoint was committed in any of them")


def test_k_zero_never_stops_and_k_one_looks_at_the_last_attempt_alone(tmp_path):
    job = job_with(tmp_path, "0 7\n")
    assert progress_guard.verdict(job, "0", 50, 0) is None
    assert progress_guard.verdict(job, "0", 0, 1) is None
    assert progress_guard.verdict(job, "0", 1, 1) == (
        "no progress in the last attempt (1): the newest checkpoint is still step 7, committed in attempt 0")


def test_a_done_note_is_progress_in_its_attempt(tmp_path):
    job = job_with(tmp_path, "0 +\n0 +\n2 +\n")
    assert progress_guard.verdict(job, "0", 4, 3) is None
    assert progress_guard.verdict(job, "0", 5, 3) == (
        "no progress over the last 3 attempts (3-5): nothing new was committed in any of them "
        "(the last new work was in attempt 2)")


def test_the_attempts_may_be_given_as_the_numbers_that_ran(tmp_path):
    job = job_with(tmp_path, "0 10\n2 10\n5 10\n9 11\n")
    assert progress_guard.verdict(job, "0", [0, 2, 5], 2) == (
        "no progress over the last 2 attempts (2, 5): the newest checkpoint is still step 10, committed in attempt 0")
    # notes of later attempts than the one asked about do not count for it
    assert progress_guard.verdict(job, "0", [5, 2, 0], 2) == progress_guard.verdict(job, "0", [0, 2, 5], 2)
    assert progress_guard.verdict(job, "0", [0, 2, 5, 9], 2) is None


def test_each_task_has_its_own_notes(tmp_path):
    job = job_with(tmp_path, "0 1\n1 2\n2 3\n", task="1")
    assert progress_guard.verdict(job, "1", 2, 2) is None
    assert "no checkpoint was committed" in progress_guard.verdict(job, "0", 2, 2)


def test_a_line_torn_by_a_crash_and_unreadable_lines_are_skipped(tmp_path):
    # attempt 2 died mid-write of "2 50": what reached the disk is "2 5", with no newline
    job = job_with(tmp_path, "0 40\nnonsense\n1 x\n1 40 extra\n\n2 5")
    assert progress_guard.records(job, "0") == [(0, 40)]
    assert "still step 40, committed in attempt 0" in progress_guard.verdict(job, "0", 2, 2)


# --- the notes -----------------------------------------------------------------------------------------
def test_notes_append_a_line_each_with_the_attempt(in_job, monkeypatch):
    progress_guard.note(10)
    monkeypatch.setenv("HPC_RESTART_COUNT", "1")  # the local profile's count
    progress_guard.note(20)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")  # SLURM's wins
    progress_guard.note(20)
    progress_guard.note_done()
    progress_guard.note_done()  # once per attempt
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    progress_guard.note_done()
    assert progress_file(in_job, "3").read_text() == "0 10\n1 20\n2 20\n2 +\n3 +\n"
    assert progress_file(in_job, "3").stat().st_mode & 0o777 == 0o600


def test_notes_outside_a_job_or_that_cannot_be_written_are_skipped(in_job, monkeypatch):
    monkeypatch.delenv("HPC_JOB_DIR")
    progress_guard.note(1)
    progress_guard.note_done()
    assert list((in_job / layout.TASKS).iterdir()) == []
    monkeypatch.setenv("HPC_JOB_DIR", str(in_job / "gone"))  # no tasks/ folder: OSError
    progress_guard.note(1)
    progress_guard.note_done()

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    write = os.write
    monkeypatch.setenv("HPC_JOB_DIR", str(in_job))
    monkeypatch.setattr(os, "write", refuse)
    progress_guard.note(1)
    progress_guard.note_done()
    monkeypatch.setattr(os, "write", write)
    assert progress_file(in_job, "3").read_text() == ""  # opened, nothing written, nothing raised
    progress_guard.note_done()  # the failed one above did not count as noted
    assert progress_file(in_job, "3").read_text() == "0 +\n"


# --- the batch script's command ------------------------------------------------------------------------
def run_guard(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*GUARD, *map(str, args)], capture_output=True, text=True, timeout=60)


def test_the_command_prints_the_reason_and_exits_3_when_the_job_must_stop(tmp_path):
    job = job_with(tmp_path, "0 40\n1 40\n")
    stop = run_guard(job, 0, 2, 2)
    assert stop.returncode == 3
    assert stop.stdout == ("no progress over the last 2 attempts (1-2): the newest checkpoint is still step 40, "
                           "committed in attempt 0\n")
    go = run_guard(job, 0, 1, 2)
    assert (go.returncode, go.stdout, go.stderr) == (0, "", "")
    off = run_guard(job, 0, 9, 0)
    assert (off.returncode, off.stdout) == (0, "")


@pytest.mark.parametrize("args", [(), ("JOB", "0", "two", "3"), ("JOB", "0", "1")])
def test_a_guard_that_cannot_decide_lets_the_job_run_again(tmp_path, args):
    proc = run_guard(*args)
    assert proc.returncode == 0 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "the job may run again" in proc.stderr


def test_a_progress_file_that_cannot_be_read_lets_the_job_run_again(tmp_path, capsys):
    job = job_with(tmp_path, "")
    progress_file(job).unlink()
    progress_file(job).mkdir()  # reading it fails with an OSError other than "not there"
    assert progress_guard.main([str(job), "0", "5", "3"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.splitlines()) == 1 and "could not decide" in out.err


# --- through the real writers --------------------------------------------------------------------------
@pytest.fixture
def single_in_job(in_job, monkeypatch):
    """This process as rank 0 of a world of one, in attempt 2 of a job; the signal handlers put back after."""
    for key in list(os.environ):
        if key.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "HPC_REQUEUE", "HPC_STOP")):
            monkeypatch.delenv(key)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")  # recorded as absent: what the Accelerator exports goes with the test
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}
    yield in_job
    for number, handler in handlers.items():
        signal.signal(number, handler)


def test_committed_checkpoints_and_chunks_are_noted_by_rank_0(single_in_job, tmp_path):
    import torch

    from hpc import Accelerator, BatchInference

    acc = Accelerator(cpu=True, project_dir=tmp_path / "proj")
    model = torch.nn.Linear(1, 1, bias=False)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))

    def step():
        acc.backward(model(torch.ones(1, 1)).sum())
        opt.step()
        opt.zero_grad()

    step()
    acc.save_state()  # committed at step 1
    acc.save_state()  # the same step again
    step()
    acc.save_state(tmp_path / "named", async_save=True)  # committed in the background: noted once seen committed
    acc.end_training()  # waits for it
    job = BatchInference(tmp_path / "out", num_items=6, chunk_size=2)
    for chunk in job:
        chunk.commit([0] * len(chunk.indices))  # noted once, with the first
    job.finish()
    assert progress_file(single_in_job, "3").read_text() == "2 1\n2 1\n2 2\n2 +\n"
