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
