"""`hpc report` is right for the common case: a run that ends by itself. Each way a script ends (it returns, as
most Accelerate scripts do, end_training(), sys.exit(0), sys.exit(3), an exception, a SIGKILL), on the local
profile and on the on-machine SLURM (2 nodes, and an array), held against what the script measured from outside
hpc: its loop's start, the time of each optimizer step, the moment before it ended.

A run that returned was reported `killed after step 1 (last recorded)`, its goodput near zero and the rest of the
allocation under `stopping`; a job without hpc's runtime on the local profile, `no attempt has started yet`."""

import json
import shutil
from pathlib import Path

import pytest

from tests.jobhelpers import hpc, make_project

HERE = Path(__file__).parent
REPO = HERE.parent
STEPS = 6
# how the script ends -> (the report's reason starts with, the job's state)
ENDS = {
    "return": (f"ended after step {STEPS}", "COMPLETED"),
    "end_training": ("work done", "COMPLETED"),
    "sys_exit0": (f"ended after step {STEPS}", "COMPLETED"),
    "sys_exit3": (f"ended after step {STEPS}", "FAILED"),
    "exception": (f"failed after step {STEPS}: RuntimeError", "FAILED"),
    "kill": ("killed after step", "FAILED"),
}


def _submit(project: Path, end: str, *flags: str, save_at: int | None = None) -> tuple[str, Path]:
    out = project / f"out-{end}"
    spec = {"out": str(out), "steps": STEPS, "sleep": 0.2, "end": end, **({"save_at": save_at} if save_at else {})}
    proc = hpc(project, "submit", "--json", *flags, "-J", f"end-{end}", "ending_worker.py", "--", json.dumps(spec),
               timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["job_id"], out


def _wait(project: Path, job: str) -> None:
    proc = hpc(project, "wait", job, "--timeout", "240", timeout=260)
    assert "COMPLETED" in proc.stdout or "FAILED" in proc.stdout, proc.stdout + proc.stderr


def _measured(out: Path) -> dict:
    steps = [(int(s), float(t)) for s, t in (line.split() for line in (out / "steps").read_text().splitlines())]
    return {"loop": float((out / "loop").read_text()), "steps": steps, "end": float((out / "end").read_text())}


def _check(project: Path, job: str, out: Path, end: str, nodes: int = 1) -> dict:
    data = json.loads(hpc(project, "report", "--json", job, check=True).stdout)
    reason, state = ENDS[end]
    assert data["state"] == state, data
    (task,) = data["tasks"]
    (a,) = task["attempts"]
    seen = _measured(out)
    assert a["reason"].startswith(reason) and a["reason"].endswith(state), a["reason"]
    assert abs(a["training_at"] - seen["loop"]) < 0.5, (a["training_at"], seen["loop"])
    if end == "kill":  # no exit to note: the last progress line, and the rest of the allocation a kill's
        assert 1 <= a["step_to"] <= STEPS and a["phases_s"]["ending"] == 0
        return a
    assert a["step_to"] == seen["steps"][-1][0] == STEPS and a["steps_trained"] == STEPS
    run_end = a["stopped_at"] if end == "end_training" else a["ended_at"]
    assert 0 <= run_end - seen["end"] < 1.0, (run_end, seen["end"])
    assert a["phases_s"]["stopping"] == 0 and a["phases_s"]["ending"] > 0, a["phases_s"]
    # goodput against the script's own clock: training is its loop, from its start to its last step
    training = (seen["steps"][-1][1] - seen["loop"]) * nodes
    assert abs(a["node_s"]["training"] + a["node_s"]["checkpoint"] - training) < 1.0 * nodes, (a["node_s"], training)
    assert a["goodput"] == pytest.approx(a["node_s"]["training"] / a["allocated_node_s"])
    assert abs(sum(a["node_s"].values()) - a["allocated_node_s"]) < 1e-6
    text = hpc(project, "report", job, check=True).stdout
    assert "killed" not in text and f"{STEPS} trained" in text, text
    return a


@pytest.fixture(scope="module")
def local_jobs(tmp_path_factory):
    """Every ending at once on the local profile (two ranks each), and the README's job without hpc's runtime."""
    project = make_project(tmp_path_factory.mktemp("endings"))
    shutil.copy(HERE / "ending_worker.py", project)
    jobs = {end: _submit(project, end, "-p", "local", "--nproc", "2", save_at=3 if end == "return" else None)
            for end in ENDS}
    hello = json.loads(hpc(project, "submit", "--json", "-p", "local", "--nproc", "2",
                           str(REPO / "scripts" / "examples" / "hello_ranks.py"), check=True).stdout)["job_id"]
    for job, _ in jobs.values():
        _wait(project, job)
    _wait(project, hello)
    return project, jobs, hello


@pytest.mark.parametrize("end", list(ENDS))
def test_each_way_a_local_run_ends_is_reported_as_it_happened(local_jobs, end):
    project, jobs, _ = local_jobs
    job, out = jobs[end]
    a = _check(project, job, out, end)
    if end == "return":  # the script's save_state at step 3 is one save, at its step
        assert [s["step"] for s in a["saves"]] == [3]
    if end in ("return", "end_training"):  # the job's own end-of-attempt line, end_training() or not
        logs = hpc(project, "logs", job, check=True).stdout
        assert logs.count("hpc: goodput so far") == 1, logs[-2000:]


def test_a_local_job_without_hpcs_runtime_is_one_unrecorded_attempt(local_jobs):
    project, _, hello = local_jobs
    data = json.loads(hpc(project, "report", "--json", hello, check=True).stdout)
    (a,) = data["tasks"][0]["attempts"]
    assert a["reason"] == "COMPLETED" and a["phases_s"]["unrecorded"] == pytest.approx(a["seconds"])
    assert a["seconds"] > 0
    out = hpc(project, "report", hello, check=True).stdout
    assert "no attempt has started yet" not in out and "no timeline" in out, out


@pytest.mark.slurm
def test_runs_that_end_by_themselves_on_slurm_two_nodes_and_an_array(slurm, tmp_path):
    """On SLURM: a 2-node job (2 ranks a node) whose script returns, one that raises, and an array of two
    tasks whose script calls sys.exit(0), all at once."""
    project = make_project(tmp_path)
    shutil.copy(HERE / "ending_worker.py", project)
    two = _submit(project, "return", "-p", "slurm-local", "-N", "2")
    failed = _submit(project, "exception", "-p", "slurm-local", "--ntasks-per-node", "1")
    spec = {"out": str(project / "out-array-{task}"), "steps": STEPS, "sleep": 0.2, "end": "sys_exit0"}
    proc = hpc(project, "submit", "--json", "-p", "slurm-local", "--ntasks-per-node", "1", "--array", "0-1",
               "-J", "end-array", "ending_worker.py", "--", json.dumps(spec), timeout=120)
    assert proc.returncode == 0, proc.stderr
    array = json.loads(proc.stdout)["job_id"]
    for job in (two[0], failed[0], array):
        _wait(project, job)
    a = _check(project, *two, "return", nodes=2)
    assert a["nodes"] == 2 and len(a["hosts"]) == 2
    _check(project, *failed, "exception")
    data = json.loads(hpc(project, "report", "--json", array, check=True).stdout)
    assert [t["task"] for t in data["tasks"]] == ["0", "1"]
    for t in data["tasks"]:
        (a,) = t["attempts"]
        assert a["reason"] == f"ended after step {STEPS}; COMPLETED" and a["steps_trained"] == STEPS, a
        assert a["phases_s"]["stopping"] == 0
    assert data["totals"]["steps_trained"] == 2 * STEPS
