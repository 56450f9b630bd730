"""QOS-based preemption, on a second on-machine SLURM beside the main one.

One cluster has one PreemptType, and QOS live only in slurmdbd's database: scripts/slurm-local with
SLURM_LOCAL_PREEMPT=qos starts a throw-away cluster with a private MariaDB and a slurmdbd, PreemptType=preempt/qos,
and the QOS "low" (GraceTime=30), "lowzero" (GraceTime=0), both PreemptMode=requeue, and "high" (Preempt=low,lowzero).
The same trainings as the partition-based test in test_cluster_failures_slurm.py, preempted by a job in QOS "high",
must end bitwise equal to a straight run; `hpc status` and `hpc wait` read this cluster's accounting through
slurmdbd (plain sacct, no jobcomp file).
"""

import os
import shutil
import subprocess
import time

import pytest

from tests.conftest import SLURM_LOCAL, _why_no_slurm
from tests.jobhelpers import hpc, status
from tests.test_cluster_failures_slurm import (
    HELD,
    SPEC,
    _progress,
    _wait_results,
    _wait_until,
    assert_preempted_once_and_resumed,
    exclusive_profile,
)
from tests.test_preemption_slurm import Job, _start_straight_runs, _straight_results, make_project

pytestmark = pytest.mark.slurm
# its own folder and ports: the main cluster (/tmp/hpc-slurm, 6817, 17001-17003) keeps running beside it
QOS_CLUSTER = {"SLURM_LOCAL_PREEMPT": "qos", "SLURM_LOCAL_DIR": "/tmp/hpc-slurm-qos", "SLURM_LOCAL_CTLD_PORT": "6827",
               "SLURM_LOCAL_DBD_PORT": "6829", "SLURM_LOCAL_NODE_PORT0": "17100", "SLURM_LOCAL_NODES": "3",
               "SLURM_LOCAL_GRACE_TIME": "30"}


def _slurm_local(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # SLURM_CONF: the script sets its own
    return subprocess.run([str(SLURM_LOCAL), *args], env={**env, **QOS_CLUSTER}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def qos_slurm():
    """The QOS cluster, up for this module and down after it; SLURM_CONF points at it meanwhile."""
    reason = _why_no_slurm()
    if not reason and not shutil.which("slurmdbd") and not shutil.which("apt-get"):
        reason = "slurmdbd is not installed and apt-get is missing to install it"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SLURM tests, but {reason}")
        pytest.skip(reason)
    proc = _slurm_local("up", timeout=900)  # the first time it may install slurmdbd and mariadb-server
    if proc.returncode != 0:
        _slurm_local("down", timeout=120)
        pytest.fail(f"SLURM_LOCAL_PREEMPT=qos scripts/slurm-local up failed:\n{proc.stdout}\n{proc.stderr}")
    conf = _slurm_local("env", timeout=30).stdout.split("=", 1)[1].strip()
    old = os.environ.get("SLURM_CONF")  # the main cluster's, when its session fixture is up
    os.environ["SLURM_CONF"] = conf
    try:
        yield conf
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        _slurm_local("down", timeout=120)


@pytest.fixture
def project(qos_slurm, tmp_path):
    """As test_preemption_slurm's, on the QOS cluster (the main cluster is not needed)."""
    return make_project(tmp_path)


def _sacct(job_id: str, *flags: str) -> list[str]:
    """QOS|State of the job (with -D: of each attempt) from slurmdbd: plain sacct, no -c."""
    proc = subprocess.run(["sacct", "-n", "-P", "-X", *flags, "-j", job_id, "-o", "JobIDRaw,QOS,State"],
                          capture_output=True, text=True, timeout=30, check=True)
    return [line.split("|", 1)[1] for line in proc.stdout.splitlines() if line.split("|")[0] == job_id]


def _assert_accounting(job_id: str, want: list[str], *flags: str) -> None:
    """slurmctld hands records to slurmdbd in the background: give them a moment to arrive."""
    deadline = time.monotonic() + 30
    while (got := _sacct(job_id, *flags)) != want and time.monotonic() < deadline:
        time.sleep(0.5)
    assert got == want, (job_id, flags, got)


def test_qos_preempted_jobs_checkpoint_requeue_and_resume_bitwise_with_and_without_grace_time(project):
    """QOS "low" (GraceTime=30): the ranks checkpoint on SLURM's TERM and the job script requeues the job (SLURM
    would not); QOS "lowzero": SLURM kills and requeues it, and it resumes from its last periodic checkpoint."""
    grace = exclusive_profile(project, "grace", "qos: low")
    zero = exclusive_profile(project, "zero", "qos: lowzero")
    straight = _start_straight_runs(project, {"ddp": {**SPEC, "sleep": 0}})
    # the launchers the other way round from the partition test's (srun with, torchrun without a grace time)
    jobs = [Job(project, "grace-torchrun", {**HELD, "hide_slurm": True}, [],
                ["-p", grace, "--launcher", "torchrun", "--nproc", "1"]),
            Job(project, "zero-srun", HELD, [], ["-p", zero, "-N", "1", "--ntasks-per-node", "2"])]
    _wait_until("4 steps of every job", lambda: all(_progress(j) >= 4 for j in jobs), 240)
    preemptor = subprocess.run(["sbatch", "--parsable", "--qos", "high", "-N3", "--exclusive", "-J", "preemptor",
                                f"--output={project}/preemptor-%j.out", "--wrap", "sleep 3"], check=True,
                               capture_output=True, text=True).stdout.strip().split(";")[0]
    _wait_results(jobs, 300)
    assert_preempted_once_and_resumed(project, jobs, _straight_results(project, straight)["ddp"])

    # accounting from slurmdbd (-D: every attempt): the preemptor ran in QOS high; SLURM ended the zero-grace attempt
    # as PREEMPTED and requeued it
    grace_job, zero_job = jobs
    _assert_accounting(preemptor, ["high|COMPLETED"])
    _assert_accounting(zero_job.id, ["lowzero|PREEMPTED", "lowzero|COMPLETED"], "-D")
    # the grace-time attempt ended by itself inside the grace time: SLURM did not requeue it, the job script did
    _assert_accounting(grace_job.id, ["low|REQUEUED", "low|COMPLETED"], "-D")
    # `hpc status` once squeue has forgotten the jobs (MinJobAge): the state comes from sacct, through slurmdbd
    _wait_until("squeue to forget the jobs", lambda: not subprocess.run(
        ["squeue", "-h", "-j", f"{grace_job.id},{zero_job.id}"], capture_output=True, text=True).stdout.strip(), 60)
    for job in jobs:
        info = status(project, job.id)
        assert info["state"] == "COMPLETED" and info["exit_code"] == 0, info
        assert "COMPLETED" in hpc(project, "status", job.id, check=True).stdout
