"""`hpc submit` against the real on-machine SLURM (scripts/slurm-local): node1 and node2 on 127.0.0.1."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.jobhelpers import dumps, hpc, make_project, status, submit

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(slurm, tmp_path):
    return make_project(tmp_path)


@pytest.fixture(scope="module")
def timeout_job(slurm, tmp_path_factory):
    """Started by the module's first test and kept on node3: SLURM's shortest limit is a minute, which passes
    while the 2-node tests (node1 and node2) run."""
    project = make_project(tmp_path_factory.mktemp("timeout"))
    info = submit(project, "-p", "slurm-local", "--ntasks-per-node", "1", "--nodelist", "node3", "--time", "1",
                  "dump.py", env={"SLEEP": "600"})
    return project, info


def wait_ok(project, job_id, code=0, timeout=180):
    proc = hpc(project, "wait", job_id, timeout=timeout)
    assert proc.returncode == code, proc.stdout + proc.stderr
    return proc


def test_two_node_srun_job_has_four_ranks_on_two_hosts(project, timeout_job):
    info = submit(project, "-p", "slurm-local", "-N", "2", "dump.py", "--", "it's", "$HOME")
    wait_ok(project, info["job_id"])
    ranks = dumps(project)
    assert sorted(int(r["env"]["RANK"]) for r in ranks) == [0, 1, 2, 3]
    assert {r["host"] for r in ranks} == {"node1", "node2"}
    assert {r["env"]["MASTER_ADDR"] for r in ranks} == {"node1"}  # the first host of the allocation
    assert {r["env"]["WORLD_SIZE"] for r in ranks} == {"4"} and len({r["env"]["MASTER_PORT"] for r in ranks}) == 1
    by_rank = {int(r["env"]["RANK"]): r for r in ranks}
    assert [(by_rank[i]["host"], by_rank[i]["env"]["LOCAL_RANK"]) for i in range(4)] == [
        ("node1", "0"), ("node1", "1"), ("node2", "0"), ("node2", "1")]
    assert all(r["argv"] == ["it's", "$HOME"] for r in ranks)
    assert status(project, info["job_id"])["state"] == "COMPLETED"


def test_torchrun_two_nodes_two_processes_all_reduce(project):
    example = REPO / "scripts" / "examples" / "hello_ranks.py"
    info = submit(project, "-p", "slurm-local", "-N", "2", "--launcher", "torchrun", "--nproc", "2",
                  "--no-snapshot", str(example))
    wait_ok(project, info["job_id"], timeout=300)
    out = hpc(project, "logs", "--all", info["job_id"], check=True).stdout
    assert out.count("world_size=4") == 4 and out.count("all_reduce=6 ok") == 4, out
    assert {line.split("host=")[1].split()[0] for line in out.splitlines() if "host=" in line} == {"node1", "node2"}


def test_sweep_is_one_array_job_with_overrides_per_task(project, timeout_job):
    (project / "sweep.yaml").write_text("grid:\n  lr: [0.1, 0.01, 0.001, 0.0001]\n  batch: [16, 32]\n")
    args = ["-p", "slurm-local", "--ntasks-per-node", "1", "--sweep", "sweep.yaml", "dump.py", "--", "--epochs", "1"]
    dry = json.loads(hpc(project, "submit", "--dry-run", "--json", *args, check=True).stdout)
    info = submit(project, *args)
    assert info["array"] == dry["array"] == list(range(8))
    written = (Path(info["job_dir"]) / "job.sbatch").read_text()
    assert dry["script"].replace(dry["job_dir"], info["job_dir"]) == written  # but for the folder's name
    assert dry["command"][:2] == ["sbatch", "--parsable"]
    proc = wait_ok(project, info["job_id"])
    assert "8 COMPLETED" in proc.stdout
    got = {int(r["env"]["SLURM_ARRAY_TASK_ID"]): r["argv"] for r in dumps(project)}
    expected = [(lr, b) for lr in ["0.1", "0.01", "0.001", "0.0001"] for b in ["16", "32"]]
    assert got == {i: ["--epochs", "1", f"--lr={lr}", f"--batch={b}"] for i, (lr, b) in enumerate(expected)}
    st = status(project, info["job_id"])
    assert st["counts"] == {"COMPLETED": 8}
    logs = hpc(project, "logs", "--task", "5", info["job_id"], check=True).stdout
    assert "dumped task5-rank0-job" in logs


def test_cancelling_a_running_array_leaves_nothing_running(project):
    token = f"hpc-cancel-{os.getpid()}-{time.time_ns()}"
    info = submit(project, "-p", "slurm-local", "--ntasks-per-node", "1", "--array", "0-5", "dump.py", "--", token,
                  env={"SLEEP": "300"})
    deadline = time.monotonic() + 60
    try:
        while len(dumps(project)) < 2:  # some tasks running, others pending
            assert time.monotonic() < deadline, "array tasks did not start"
            time.sleep(0.2)
    finally:  # whatever failed, the array's five-minute tasks must not hold the nodes for the tests after this
        hpc(project, "cancel", info["job_id"], check=True)
    wait_ok(project, info["job_id"], code=1, timeout=60)
    st = status(project, info["job_id"])
    assert set(st["counts"]) == {"CANCELLED"}, st
    squeue = subprocess.run(["squeue", "-h", "-j", info["job_id"]], capture_output=True, text=True).stdout
    assert squeue.strip() == ""
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-f", token], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "task processes outlived the cancel"
        time.sleep(0.2)


def test_after_orders_jobs(project):
    first = submit(project, "-p", "slurm-local", "--ntasks-per-node", "1", "-J", "first", "dump.py", "--", "first",
                   env={"SLEEP": "3"})
    second = submit(project, "-p", "slurm-local", "--ntasks-per-node", "1", "-J", "second",
                    "--after", f"{first['job_id']}:afterany", "dump.py", "--", "second")
    wait_ok(project, second["job_id"])
    runs = {r["argv"][0]: r["time"] for r in dumps(project)}
    assert runs["second"] >= runs["first"] + 3  # started only after the first one ended
    assert "--dependency=afterany:" + first["job_id"] in (Path(second["job_dir"]) / "job.sbatch").read_text()


def test_failed_job_is_failed_with_its_code(project):
    info = submit(project, "-p", "slurm-local", "--ntasks-per-node", "1", "dump.py", env={"EXIT": "3"})
    wait_ok(project, info["job_id"], code=3)
    st = status(project, info["job_id"])
    assert (st["state"], st["exit_code"]) == ("FAILED", 3)


def test_cancelled_job_is_cancelled(project):
    info = submit(project, "-p", "slurm-local", "--ntasks-per-node", "1", "dump.py", env={"SLEEP": "300"})
    deadline = time.monotonic() + 60
    while not dumps(project):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    hpc(project, "cancel", info["job_id"], check=True)
    wait_ok(project, info["job_id"], code=1, timeout=60)
    assert status(project, info["job_id"])["state"] == "CANCELLED"


def test_logs_follow_streams_and_ends(project):
    (project / "talk.py").write_text(
        "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(1)\n")
    info = submit(project, "-p", "slurm-local", "--ntasks-per-node", "1", "talk.py")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "hpc", "logs", "-f", info["job_id"]], cwd=project, text=True,
                            stdout=subprocess.PIPE, env={**os.environ, "XDG_DATA_HOME": str(project / "xdg-data")})
    first = proc.stdout.readline()
    assert first.strip() == "line 0" and time.monotonic() - t0 < 30  # streamed before the job ended
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == 0
    assert rest.split("\n")[:2] == ["line 1", "line 2"]


def test_impossible_job_fails_at_submit(project):
    proc = hpc(project, "submit", "-p", "slurm-local", "--partition", "nope", "dump.py")
    assert proc.returncode == 2 and "partition 'nope' does not exist" in proc.stderr
    proc = hpc(project, "submit", "-p", "slurm-local", "--gpus-per-node", "1", "dump.py")
    assert proc.returncode == 2 and "has no GPUs" in proc.stderr


def test_time_limit_is_timeout(timeout_job):
    project, info = timeout_job
    wait_ok(project, info["job_id"], code=1, timeout=300)
    assert status(project, info["job_id"])["state"] == "TIMEOUT"
    # a script without hpc's runtime: one attempt, all of it unrecorded, ended by the limit
    report = json.loads(hpc(project, "report", "--json", info["job_id"], check=True).stdout)
    (a,) = report["tasks"][0]["attempts"]
    assert a["reason"] == "TIMEOUT" and a["phases_s"]["unrecorded"] == pytest.approx(a["seconds"]), a
    assert a["seconds"] > 50, a


def test_the_projects_own_profile_passes_its_own_check_on_the_default_cluster(project):
    """`hpc profile check slurm-local` named a difference (max_nodes 4) against the 3-node cluster that
    scripts/slurm-local starts by default."""
    proc = hpc(project, "profile", "check", "slurm-local")
    assert proc.returncode == 0 and proc.stdout.startswith("ok: slurm-local fits the cluster here"), \
        proc.stdout + proc.stderr
