"""Preemption on the real on-machine SLURM: interrupted jobs end exactly where uninterrupted ones do.

Each job trains with tests/resume_worker.py (2 ranks on 2 nodes) and is interrupted from outside while it
runs: `scancel --signal=USR1` (the job checkpoints and requeues itself), `scontrol requeue` (TERM: it
checkpoints, SLURM requeues it) and, for one job, its own time limit (the profile's USR1 10 s ahead).
The result is compared bitwise with the same training run straight through on this machine.
"""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.jobhelpers import hpc, start_straight_run, straight_run, submit
from tests.test_checkpoint import assert_same_run

pytestmark = pytest.mark.slurm
HERE = Path(__file__).parent
PROFILE = """\
name: preempt-test
extends: slurm-local
preemption:
  signal: USR1
  lead_time: 10
  max_requeues: 8
"""


def _start_straight_runs(project: Path, specs: dict) -> dict:
    """The same trainings run straight through, as 2 local processes each (all at once, in the background; one
    run per training in the session, shared by every test that compares with it)."""
    for spec in specs.values():
        start_straight_run(spec, project)
    return specs


def _straight_results(project: Path, runs: dict) -> dict:
    return {name: straight_run(spec, project) for name, spec in runs.items()}


class Job:
    """A submitted job and the interruptions still to send it: (action, steps into the attempt), at most one
    per attempt. An attempt that ends for another reason (its time limit, on a slow machine) just moves the
    plan on to the next attempt."""

    def __init__(self, project: Path, name: str, spec: dict, plan: list[tuple[str, int]], flags: list[str]):
        self.project, self.name, self.plan = project, name, list(plan)
        self.spec = {**spec, "project": str(project / name), "out": str(project / f"{name}.pt")}
        self.info = submit(project, "-p", "./preempt-test.yaml", "-N", "2", "--ntasks-per-node", "1", "-J", name,
                           *flags, "resume_worker.py", "--", json.dumps(self.spec))
        self.id = self.info["job_id"]
        self.attempt, self.attempt_start, self.acted, self.sent = -1, 0, False, []

    def _restarts(self) -> int | None:
        try:
            return int((Path(self.info["job_dir"]) / "tasks" / "0.jobid").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return None

    def _progress(self) -> int:
        try:
            return int((self.project / self.name / "progress").read_text())
        except (OSError, ValueError):
            return 0

    def poll(self) -> None:
        restarts, step = self._restarts(), self._progress()
        if restarts is None:
            return
        if restarts != self.attempt:  # a new attempt: steps count from where it resumed
            self.attempt, self.attempt_start, self.acted = restarts, step, False
            return
        if self.acted or not self.plan or step < self.attempt_start + self.plan[0][1]:
            return
        self.acted = True
        action, _ = self.plan[0]
        cmd = ["scancel", "--signal=USR1", self.id] if action == "signal" else ["scontrol", "requeue", self.id]
        if subprocess.run(cmd, capture_output=True).returncode == 0:  # else the attempt was already ending
            self.plan.pop(0)
            self.sent.append((action, step))


def _drive(jobs: list[Job], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job in jobs:
            job.poll()
        if all((job.project / f"{job.name}.pt").exists() for job in jobs):
            return
        time.sleep(0.3)
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t %E"], capture_output=True, text=True).stdout
    pytest.fail("jobs did not finish: " + ", ".join(f"{j.name} sent {j.sent}" for j in jobs)
                + f"; nodes: {' / '.join(sorted(set(nodes.splitlines())))}")


def make_project(folder: Path) -> Path:
    """A folder with the training script and the preempt-test profile."""
    shutil.copy(HERE / "resume_worker.py", folder)
    (folder / "preempt-test.yaml").write_text(PROFILE)
    return folder


@pytest.fixture
def project(slurm, tmp_path):
    return make_project(tmp_path)


def _finish(project: Path, job: Job, straight: dict) -> dict:
    proc = hpc(project, "wait", job.id, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = torch.load(project / f"{job.name}.pt", weights_only=False)
    assert_same_run(straight, result)
    logs = hpc(project, "logs", "--all", job.id, check=True).stdout
    return {"result": result, "logs": logs}


def test_interrupted_jobs_resume_bitwise_srun_and_torchrun_ddp_and_fsdp(project):
    """Two FSDP jobs, srun and torchrun: scancel --signal (it requeues itself), then scontrol requeue (TERM;
    SLURM requeues it). torchrun's agent ignores USR1: its workers learn of it from SLURM's signal to the whole
    step and from the stop file. A DDP job, srun-ddp, runs under a 1-minute limit and meets it (USR1 10 s ahead,
    as SLURM sends it) until done. Three 2-node jobs fill the cluster's six slots: none waits for another, as each
    has its own pair of the three nodes (left to SLURM, the first two share node1 and node2 and the third waits for
    one of them, attempt after attempt)."""
    # srun-ddp's first attempt must still be training when the warning comes (at one of slurmctld's periodic
    # checks, at most 10 s before the limit): 90 steps of 0.7 s outlast the minute. The FSDP jobs are interrupted
    # in their first two attempts. The attempt after those has nothing left to wait for: no sleeps.
    specs = {"ddp": {"strategy": "ddp", "steps": 90, "save_every": 10, "sleep": 0.7, "sleep_attempts": 1},
             "fsdp": {"strategy": "fsdp", "steps": 24, "save_every": 5, "sleep": 0.4, "sleep_attempts": 2}}
    plan = [("signal", 4), ("requeue", 4)]
    torchrun = ["--launcher", "torchrun", "--nproc", "1", "--time", "5"]
    jobs = [Job(project, "srun-ddp", specs["ddp"], [], ["--time", "1", "-w", "node1,node2"]),
            Job(project, "torchrun-fsdp", specs["fsdp"], plan, [*torchrun, "-w", "node2,node3"]),
            Job(project, "srun-fsdp", specs["fsdp"], plan, ["--time", "5", "-w", "node1,node3"])]
    runs = _start_straight_runs(project, specs)
    _drive(jobs, timeout=600)
    straight = _straight_results(project, runs)
    straight = {"srun-ddp": straight["ddp"], "torchrun-fsdp": straight["fsdp"], "srun-fsdp": straight["fsdp"]}
    for job in jobs:
        done = _finish(project, job, straight[job.name])
        requeues = [a[0] for a in done["result"]["attempts"]]
        assert "stop requested (USR1)" in done["logs"] and "requeued SLURM job" in done["logs"], job.name
        if job.name == "srun-ddp":  # no one signalled it: its own time limit's warning did, and it came back
            assert job.sent == [] and requeues[:2] == [0, 1], requeues
            continue
        assert [a for a, _ in job.sent] == ["signal", "requeue"], (job.name, job.sent)
        assert requeues[:3] == [0, 1, 2], (job.name, requeues)
        assert "stop requested (TERM)" in done["logs"], job.name


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_a_rank_that_dies_fails_the_job_within_a_minute_with_its_error_in_the_logs(project, launcher):
    spec = {"strategy": "ddp", "steps": 50, "sleep": 0.2, "crash_at": 3, "crash_rank": 1,
            "project": str(project / "p"), "out": str(project / "p.pt")}
    flags = ["--launcher", "torchrun", "--nproc", "1"] if launcher == "torchrun" else []
    info = submit(project, "-p", "./preempt-test.yaml", "-N", "2", "--ntasks-per-node", "1", "--time", "5", *flags,
                  "resume_worker.py", "--", json.dumps(spec))
    proc = hpc(project, "wait", info["job_id"], timeout=180)
    ended = time.time()
    assert proc.returncode != 0 and "FAILED" in proc.stdout, proc.stdout
    crashed = float((project / "p" / "crashed_at").read_text())
    assert ended - crashed < 60, f"the job took {ended - crashed:.0f} s to fail after rank 1 died"
    logs = hpc(project, "logs", "--all", info["job_id"], check=True).stdout
    assert "RuntimeError: planned crash at step 3" in logs


def test_elastic_torchrun_restarts_a_crashed_group_from_the_newest_checkpoint(project):
    spec = {"strategy": "ddp", "steps": 16, "save_every": 4}
    runs = _start_straight_runs(project, {"elastic": spec})
    spec = {**spec, "crash_at": 7, "crash_rank": 1}
    job = Job(project, "elastic", spec, [], ["--launcher", "torchrun", "--nproc", "1", "--elastic", "1:2",
                                             "--max-restarts", "1", "--time", "5"])
    _drive([job], timeout=300)
    done = _finish(project, job, _straight_results(project, runs)["elastic"])
    # no requeue: torchrun restarted the group. (The restart count a worker sees is its own agent's: an agent
    # that restarts only because the other node rejoined counts 0, so it says nothing about the group.)
    assert {requeues for requeues, _ in done["result"]["attempts"]} == {0}
    assert "planned crash at step 7" in done["logs"] and "checkpoints/step-4 (step 4, the shared tier)" in done["logs"]
