"""`hpc.submit()` from Python: scripts and functions, on the local profile and on the real SLURM (bad keys:
tests/unit/test_api.py)."""

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


def test_function_on_the_local_profile(project):
    job = hpc.submit(where_am_i, 7, profile="local", nproc_per_node=2)
    results = job.results()
    assert [r["RANK"] for r in results] == ["0", "1"]
    assert {(r["WORLD_SIZE"], r["MASTER_ADDR"], r["x"]) for r in results} == {("2", "127.0.0.1", 7)}
    assert len({r["MASTER_PORT"] for r in results}) == 1
    runtime = json.loads(Path(results[0]["HPC_RUNTIME_CONFIG"]).read_text())  # settings, as script jobs get them
    assert runtime["profile"] == "local" and runtime["nproc_per_node"] == 2


@pytest.mark.slurm
def test_function_on_two_slurm_nodes_honours_the_profile_like_a_script(project, slurm):
    (project / "fn.yaml").write_text("name: fn\nextends: slurm-local\nsbatch_extra: ['--comment=function-job']\n"
                                     "env: {FROM_PROFILE: 'yes'}\npreemption: {requeue: false}\n")
    job = hpc.submit(where_am_i, 3, profile="./fn.yaml", nodes=2, nproc_per_node=2, time="5")
    script = (job.job_dir / "job.sbatch").read_text()
    for line in ("#SBATCH --comment=function-job", "#SBATCH --no-requeue", "#SBATCH --time=00:05:00",
                 "export FROM_PROFILE=yes", "-m hpc.runtime.function_runner"):
        assert line in script
    results = job.results(timeout=180)
    assert [int(r["RANK"]) for r in results] == [0, 1, 2, 3]
    assert [r["host"] for r in results] == ["node1", "node1", "node2", "node2"]
    assert {r["MASTER_ADDR"] for r in results} == {"node1"} and {r["WORLD_SIZE"] for r in results} == {"4"}
    assert {int(r["MASTER_PORT"]) for r in results} == {int(job.id) % 4536 + 61000}


def test_a_function_job_is_a_job_like_any_other(project):
    """Its record is listed, its logs and state are there, and the profile's settings reach it."""
    from tests.jobhelpers import hpc as hpc_cli

    job = hpc.submit(where_am_i, 1, profile="local", env={"FROM_KEYS": "yes"})
    assert job.result(timeout=120)["x"] == 1
    listed = json.loads(hpc_cli(project, "list", "--json", check=True).stdout)
    assert [(r["job_id"], r["kind"], r["state"]) for r in listed] == [(job.id, "function", "COMPLETED")]
    assert "export FROM_KEYS=yes" in (job.job_dir / "job.sh").read_text()  # the same template as a script


def test_a_failing_function_raises_with_the_jobs_traceback(project):
    from hpc.cluster.functions import FunctionFailed

    job = hpc.submit(int, "not a number", profile="local")
    assert job.wait(timeout=120) == 1
    with pytest.raises(FunctionFailed, match="invalid literal for int"):
        job.result()


def test_the_warning_signal_before_an_accelerator_requeues_what_checkpoint_asks_for(project):
    """No Accelerator has taken the signal over: rank 0 stores what the callable's checkpoint() returns, the job
    script runs the ranks again, and they run that (x + 1) instead of starting over."""
    import signal
    import time

    from tests.jobhelpers import Resumable, local_script_process

    started = project / "started"
    job = hpc.submit(Resumable(), 0, str(started), profile="local", nproc_per_node=2)
    deadline = time.monotonic() + 60
    while not (project / "started0").exists() or not (project / "started1").exists():
        assert time.monotonic() < deadline and job.state() == "RUNNING", job.logs(rank=None)
        time.sleep(0.1)
    local_script_process(job.job_dir).send_signal(signal.SIGUSR1)
    assert job.results(timeout=120) == [{"x": 1, "restart": "1", "rank": "0"}, {"x": 1, "restart": "1", "rank": "1"}]
    assert "function stopped by USR1" in job.logs(rank=0)
