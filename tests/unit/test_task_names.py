"""A task given by the user (`hpc cancel --task`, `hpc logs --task`, Job.logs(task=)) is one of the job's tasks or
refused in one line, before any scheduler is asked: a task becomes a SLURM id, a log name and a glob."""

import subprocess
import sys
import time

import psutil
import pytest

from hpc.cluster import status
from hpc.cluster.backends.local import LocalBackend
from hpc.cluster.backends.slurm import SlurmBackend
from hpc.cluster.records import JobRecord
from hpc.contract import layout
from hpc.errors import HpcError
from hpc.slurm.commands import Slurm
from tests.unit.test_slurm_recorded import Recorded
from tests.unit.test_trust_status import fake_slurm_env, hpc_cli, record_job

BAD_TASKS = ["../x", "1-2", "0,1", "*", "", " 1", "01", "3", "1_2", "1\n"]


def job(tmp_path, scheduler="slurm", array=(0, 1, 2), **kw) -> JobRecord:
    folder = tmp_path / "job"
    (folder / layout.LOGS).mkdir(parents=True, exist_ok=True)
    return JobRecord(job_id="42", scheduler=scheduler, profile="p", name="train", job_dir=str(folder),
                     submitted_at=time.time(), argv=[], workdir=str(tmp_path), script="job.sbatch",
                     array=list(array) if array is not None else None, **kw)


@pytest.fixture
def no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))


@pytest.mark.parametrize("task", BAD_TASKS)
def test_a_task_the_job_does_not_have_is_refused_in_one_line(tmp_path, task):
    with pytest.raises(HpcError) as err:
        job(tmp_path).task_named(task)
    assert str(err.value).startswith(f"job 42 has no task {task!r}") and "0, 1, 2" in str(err.value)
    assert job(tmp_path).task_named("1") == "1"


def test_a_big_array_names_its_tasks_in_short(tmp_path):
    with pytest.raises(HpcError) as err:
        job(tmp_path, array=range(10000)).task_named("10000")
    assert "0, 1, 2, ... 9999" in str(err.value) and len(str(err.value)) < 200


@pytest.mark.parametrize("task", ["../x", "1-2", "*"])
def test_slurm_cancel_of_a_bad_task_asks_nothing_and_marks_nothing(tmp_path, no_cache, task):
    record = job(tmp_path)
    asked = Recorded([])  # any command at all fails the test
    with pytest.raises(HpcError, match="has no task"):
        SlurmBackend(Slurm(asked)).cancel(record, task)
    assert asked.calls == [] and not record.marked(layout.CANCELLED)


@pytest.mark.parametrize(("array", "task", "target"), [((0, 1, 2), "1", "42_1"), (None, "0", "42")])
def test_slurm_cancel_names_the_task_as_slurm_does(tmp_path, no_cache, array, task, target):
    (tmp_path / "slurm.conf").write_text("")
    asked = Recorded([(["scancel"], (0, "", ""))])
    SlurmBackend(Slurm(asked)).cancel(job(tmp_path, array=array), task)
    assert asked.calls == [["scancel", target]]  # a plain job's one task is the job: scancel 42, not 42_0


def test_local_cancel_of_a_bad_task_leaves_the_job_running(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        record = job(tmp_path, scheduler="local", array=None,
                     local={"pid": proc.pid, "start": psutil.Process(proc.pid).create_time()})
        with pytest.raises(HpcError, match="has no task '../x'"):
            LocalBackend().cancel(record, "../x")
        assert proc.poll() is None and not record.marked(layout.CANCELLED)
    finally:
        proc.kill()
        proc.wait()


def test_logs_of_a_bad_task_are_refused_through_the_api_too(tmp_path):
    record = job(tmp_path)
    (record.dir / layout.LOGS / "rank0-42_1.out").write_text("hi\n")
    with pytest.raises(HpcError, match="has no task '\\*'"):
        status.log_files(record, "*", "all")  # was: a glob over every task's logs


def test_hpc_cancel_with_a_bad_task_is_exit_2_and_one_line(tmp_path, monkeypatch):
    env = fake_slurm_env(tmp_path)
    called = tmp_path / "scancel-was-called"
    (tmp_path / "fakebin" / "scancel").write_text(f"#!/bin/bash\ntouch {called}\n")
    (tmp_path / "fakebin" / "scancel").chmod(0o755)
    record_job(job(tmp_path), env, monkeypatch)
    for command in (["cancel", "42", "--task", "../x"], ["logs", "42", "--task", "../x"]):
        out = hpc_cli(env, *command)
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith("hpc: error: job 42 has no task '../x'") and out.stderr.count("\n") == 1
    assert not called.exists()
