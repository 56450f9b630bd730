"""`hpc.submit()` from Python: scripts and functions, on the local profile and on the real SLURM."""

import json
import os
from pathlib import Path

import pytest

import hpc
from tests.jobhelpers import dumps, make_project, where_am_i

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(tmp_path, monkeypatch):
    make_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("DUMP_DIR", str(tmp_path / "dumps"))
    # the function's module must be importable in the job's processes
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def test_script_job_handle(project):
    job = hpc.submit("dump.py", "--flag", "a b", profile="local", nproc_per_node=2)
    assert job.wait(timeout=120) == 0
    assert job.state() == "COMPLETED"
    assert "dumped task0-rank0" in job.logs(rank=0) and "dumped task0-rank1" in job.logs(rank=1)
    assert [r["argv"] for r in dumps(project)] == [["--flag", "a b"]] * 2
    assert (job.job_dir / "record.json").is_file()


def test_bad_keys_raise_the_projects_error(project):
    with pytest.raises(hpc.HpcError, match="nodez"):
        hpc.submit("dump.py", profile="local", nodez=2)


def test_function_on_the_local_profile(project):
    job = hpc.submit(where_am_i, 7, profile="local", nproc_per_node=2)
    results = job.results()
    assert [r["RANK"] for r in results] == ["0", "1"]
    assert {(r["WORLD_SIZE"], r["MASTER_ADDR"], r["x"]) for r in results} == {("2", "127.0.0.1", 7)}
    assert len({r["MASTER_PORT"] for r in results}) == 1
    runtime = json.loads(Path(results[0]["HPC_RUNTIME_CONFIG"]).read_text())  # settings, as script jobs get them
    assert runtime["profile"] == "local" and runtime["nproc_per_node"] == 2


@pytest.mark.slurm
def test_function_on_two_slurm_nodes(project, slurm):
    job = hpc.submit(where_am_i, 3, profile="slurm-local", nodes=2, nproc_per_node=2)
    results = job.results()
    assert [int(r["RANK"]) for r in results] == [0, 1, 2, 3]
    assert [r["host"] for r in results] == ["node1", "node1", "node2", "node2"]
    assert {r["MASTER_ADDR"] for r in results} == {"node1"} and {r["WORLD_SIZE"] for r in results} == {"4"}
    assert {int(r["MASTER_PORT"]) for r in results} == {int(job.id) % 4536 + 61000}


class _OwnCheckpoint:
    def __call__(self, x):
        return x

    def checkpoint(self, x):
        import submitit

        return submitit.helpers.DelayedSubmission(self, x + 1)


def test_function_jobs_are_checkpointable_so_submitit_requeues_them():
    """submitit requeues (instead of failing at its time-limit signal) only what has checkpoint(): the same
    call again, or what the user's own checkpoint() returns, still wrapped for the rendezvous."""
    from hpc.api import _WithRendezvous

    plain = _WithRendezvous(where_am_i)
    again = plain.checkpoint(5)
    assert again.function is plain and again.args == (5,)
    own = _WithRendezvous(_OwnCheckpoint())
    again = own.checkpoint(5)
    assert isinstance(again.function, _WithRendezvous) and isinstance(again.function.fn, _OwnCheckpoint)
    assert again.args == (6,)
