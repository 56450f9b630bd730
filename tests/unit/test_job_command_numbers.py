"""The numbers the job commands take are checked like every other input: one line and exit 2, never a traceback
(`hpc list -n -5`), a wait for ever (`hpc wait --timeout nan`) or a wait given up at once (`--timeout -1`)."""

import subprocess
import sys
import time

import pytest

from hpc.cluster import status
from hpc.cluster.records import JobRecord
from hpc.errors import HpcError
from hpc.slurm.commands import TaskState
from tests.unit.test_trust_status import fake_slurm_env, record_job


def running_job(tmp_path) -> JobRecord:
    (tmp_path / "job").mkdir()
    return JobRecord(job_id="42", scheduler="slurm", profile="p", name="train", job_dir=str(tmp_path / "job"),
                     submitted_at=time.time(), argv=[], workdir=str(tmp_path), script="job.sbatch")


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0])
def test_a_wait_bound_that_is_no_bound_is_refused(tmp_path, monkeypatch, timeout):
    monkeypatch.setattr(status, "states", lambda record: {"0": TaskState("RUNNING")})
    with pytest.raises(HpcError, match=f"timeout = {timeout}: is not a finite number of seconds"):
        status.wait(running_job(tmp_path), timeout)


@pytest.mark.parametrize(("args", "said"), [
    (["list", "-n", "-5"], "Invalid value for '-n': -5 is not in the range x>=1"),
    (["logs", "42", "--rank", "-1"], "Invalid value for '--rank': -1 is not in the range x>=0"),
    (["wait", "42", "--timeout", "nan"], "timeout = nan: is not a finite number of seconds"),
    (["wait", "42", "--timeout", "-1"], "timeout = -1.0: is not a finite number of seconds"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_the_job_commands_refuse_bad_numbers_in_one_line(tmp_path, monkeypatch, args, said):
    env = fake_slurm_env(tmp_path, squeue=(0, "42|RUNNING|42|None"))
    record_job(running_job(tmp_path), env, monkeypatch)
    out = subprocess.run([sys.executable, "-m", "hpc", *args], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=30, check=False)  # a wait for ever fails here
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith(f"hpc: error: {said}") and out.stderr.count("\n") == 1, out.stderr


def test_the_latest_job_is_the_newest_whose_folder_is_left_and_a_gone_one_is_named(tmp_path, monkeypatch):
    """A job's folder deleted (a temporary project, a cleaned-up run): `hpc status` with no id takes the newest
    job still there, as `hpc list` does, and a job asked for by id whose folder is gone is named in one line."""
    import shutil

    from hpc.cluster import records

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    for folder, job_id, at in ((kept, "41", 1.0), (gone, "42", 2.0)):
        folder.mkdir(mode=0o700)
        records.save(JobRecord(job_id=job_id, scheduler="slurm", profile="p", name="train", job_dir=str(folder),
                               submitted_at=at, argv=[], workdir=str(tmp_path), script="job.sbatch"))
    assert records.find(None).job_id == "42"
    shutil.rmtree(gone)
    assert records.find(None).job_id == "41"
    with pytest.raises(HpcError, match=f"job 42's folder {gone} is gone"):
        records.find("42")
    shutil.rmtree(kept)
    with pytest.raises(HpcError, match="the folders of all 2 recorded jobs are gone"):
        records.find(None)
