"""What shared clusters do to running jobs, on the on-machine SLURM (scripts/slurm-local: 3 nodes, partition
"high" preempts "low" (GraceTime=0: SLURM kills and requeues) and "lowgrace" (GraceTime=30: TERM to the tasks,
then 30 s to finish, and SLURM does not requeue a job that ends inside them)).

Every interrupted training must end bitwise equal to the same training run straight through.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.jobhelpers import hpc, status, submit
from tests.test_checkpoint import assert_same_run
from tests.test_preemption_slurm import Job, _finish, _start_straight_runs, _straight_results, project  # noqa: F401
from tests.test_trust_slurm import _controller_pid

pytestmark = pytest.mark.slurm
SLURM_LOCAL = Path(__file__).parents[1] / "scripts" / "slurm-local"
# the first attempt, the one each test interrupts, sleeps 0.3 s a step; the next resumes and runs straight through
SPEC = {"strategy": "ddp", "steps": 16, "save_every": 4, "sleep": 0.3, "sleep_attempts": 1}
HELD = {**SPEC, "hold_at": 4}  # the first attempt waits at step 4 (checkpointed) for what the test does to it


def exclusive_profile(project: Path, name: str, where: str) -> str:
    """A profile whose jobs hold their nodes whole (so a high-tier job has to take them), `where` a YAML line
    such as "partition: lowgrace" or "qos: low"."""
    (project / f"{name}.yaml").write_text(f"name: {name}\nextends: ./preempt-test.yaml\n{where}\n"
                                          "sbatch_extra: ['--exclusive']\n")
    return f"./{name}.yaml"


def _progress(job: Job) -> int:
    return job._progress() if job._restarts() == 0 else -1


def _wait_until(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _wait_results(jobs: list[Job], timeout: float) -> None:
    _wait_until("the jobs' results", lambda: all((j.project / f"{j.name}.pt").exists() for j in jobs), timeout)


def _preempt_all_nodes(project: Path) -> None:
    """A job in the high-tier partition that needs every node: it preempts whatever runs there."""
    subprocess.run(["sbatch", "--parsable", "-p", "high", "-N3", "--exclusive", "-J", "preemptor",
                    f"--output={project}/preemptor-%j.out", "--wrap", "sleep 3"], check=True, capture_output=True)


def test_preempted_jobs_checkpoint_requeue_and_resume_bitwise_with_and_without_grace_time(project):
    """With a grace time the ranks checkpoint on SLURM's TERM and the job script requeues the job (SLURM would
    not); without one SLURM kills and requeues it, and the job resumes from its last periodic checkpoint.
    The grace-time ranks cannot run SLURM's commands (as in a container): the requeue comes from the host."""
    grace = exclusive_profile(project, "grace", "partition: lowgrace")
    nograce = exclusive_profile(project, "nograce", "partition: low")
    straight = _start_straight_runs(project, {"ddp": {**SPEC, "sleep": 0}})
    # torchrun with and srun without a grace time: tests/test_qos_preemption_slurm.py (the same job script path)
    jobs = [Job(project, "grace-srun", {**HELD, "hide_slurm": True}, [], ["-p", grace]),
            Job(project, "nograce-torchrun", HELD, [], ["-p", nograce, "-N", "1", "--launcher", "torchrun",
                                                        "--nproc", "2"])]
    _wait_until("4 steps of every job", lambda: all(_progress(j) >= 4 for j in jobs), 240)
    _preempt_all_nodes(project)
    _wait_results(jobs, 300)
    assert_preempted_once_and_resumed(project, jobs, _straight_results(project, straight)["ddp"])


def assert_preempted_once_and_resumed(project: Path, jobs: list[Job], want: dict) -> None:
    """Each job ended bitwise equal to the straight run after its preemption; a job whose name starts with
    "grace" was requeued by its job script, any other by SLURM alone. On a busy machine SLURM may start a requeued
    job again before the preemptor has all its nodes, and preempt it once more before its first step (seen): each
    preemption is then one more requeue."""
    for job in jobs:
        done = _finish(project, job, want)  # also `hpc wait`
        requeues = [a[0] for a in done["result"]["attempts"]]
        assert requeues[0] == 0 and len(requeues) >= 2, (job.name, done["result"]["attempts"])
        if job.name.startswith("grace"):
            assert "stop requested (TERM)" in done["logs"], done["logs"]
            assert done["logs"].count("requeued SLURM job") == requeues[-1], done["logs"]
            assert "(preempted at " in done["logs"], done["logs"]
        else:  # SLURM requeued it; the job script must not requeue it a second time
            assert "requeued SLURM job" not in done["logs"], done["logs"]
        _the_report_tells_the_preemption(project, job)


def _the_report_tells_the_preemption(project: Path, job: Job) -> None:
    """`hpc report`: the first attempt stopped on TERM at a step boundary (with grace time: nothing redone, the
    next resumes from its step) or, without, was killed unless KillWait let it reach one; the last ends
    COMPLETED, its end no stop."""
    data = json.loads(hpc(project, "report", "--json", job.id, check=True).stdout)
    (task,) = data["tasks"]
    first, second, last = task["attempts"][0], task["attempts"][1], task["attempts"][-1]
    assert "requeued" in first["reason"], first["reason"]
    if job.name.startswith("grace"):
        assert first["reason"].startswith("stopped at step") and "TERM" in first["reason"], first["reason"]
        assert first["redone_steps"] == 0 and second["resumed_from"] == first["step_to"], (first, second)
    else:  # SLURM's TERM, then KILL after KillWait: a rank that reaches a step boundary first stops there
        assert first["reason"].startswith(("killed after step", "stopped at step")), first["reason"]
    assert last["reason"].endswith("COMPLETED") and last["phases_s"]["stopping"] == 0, last
    for a in task["attempts"]:
        assert sum(a["node_s"].values()) == pytest.approx(a["allocated_node_s"]), a


def test_a_cancelled_job_stays_cancelled_in_a_partition_with_grace_time(project):
    job = Job(project, "cancelled", HELD, [], ["-p", exclusive_profile(project, "grace", "partition: lowgrace"),
                                               "-N", "1"])
    _wait_until("4 steps", lambda: _progress(job) >= 4, 240)
    hpc(project, "cancel", job.id, check=True)
    proc = hpc(project, "wait", job.id, timeout=120)
    assert "CANCELLED" in proc.stdout, proc.stdout
    logs = hpc(project, "logs", "--all", job.id, check=True).stdout
    assert "stop requested (TERM)" in logs and "requeued" not in logs, logs
    assert job._restarts() == 0


def test_a_lost_node_ends_the_attempt_within_a_minute_and_the_next_excludes_it(project):
    """Node death: its slurmd and every process on it killed. The rank on the other node sees its peer vanish;
    srun would wait for the dead node until SLURM declares it down, so the job script stops waiting, names the
    node, and requeues the job excluding it. The next attempt resumes from the newest checkpoint."""
    straight = _start_straight_runs(project, {"ddp": SPEC})
    job = Job(project, "lost", HELD, [], ["-N", "2", "--ntasks-per-node", "1"])
    _wait_until("4 steps", lambda: _progress(job) >= 4, 240)
    victim = (project / "lost" / "host-a0-r1").read_text()  # not the first node, where the batch script runs
    killed = time.monotonic()
    try:
        subprocess.run([str(SLURM_LOCAL), "kill-node", victim], check=True, capture_output=True)
        lost = Path(job.info["job_dir"]) / "tasks" / "0.lost_nodes"
        _wait_until("the lost node to be named", lost.exists, 90)
        assert time.monotonic() - killed < 60, f"the attempt took {time.monotonic() - killed:.0f} s to end"
        assert lost.read_text().split() == [victim]
        # the node boots again while the next attempt runs elsewhere (later tests want all 3 nodes)
        revive = subprocess.Popen([str(SLURM_LOCAL), "revive-node", victim], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        _wait_results([job], 300)
        done = _finish(project, job, _straight_results(project, straight)["ddp"])
        assert [a[0] for a in done["result"]["attempts"]] == [0, 1]
        again = {(project / "lost" / f"host-a1-r{r}").read_text() for r in (0, 1)}
        assert victim not in again and len(again) == 2, again
        assert f"next attempt excludes {victim}" in done["logs"], done["logs"]
        info = status(project, job.id)
        assert info["lost_nodes"] == [victim], info
        assert victim in hpc(project, "status", job.id, check=True).stdout
        revive.wait(timeout=180)
    finally:  # idempotent: nothing happens if it is back already
        subprocess.run([str(SLURM_LOCAL), "revive-node", victim], capture_output=True, timeout=180)


def test_a_hot_spare_takes_a_lost_nodes_place_in_the_same_attempt_and_is_sent_its_fast_tier_folder(project):
    """A plain srun job of 2 nodes and 1 spare (all of slurm-local's 3), the fast tier on. Node death at step 3:
    the job script names the lost node, puts the spare in its place and runs the step again within the attempt (no
    requeue: SLURM's restart count stays 0). The spare is sent the lost rank's fast-tier folder of step 2 by the
    node that kept its copy (the script's first save_state comes at step 4): one step trained twice, and the run
    ends bitwise equal to a straight one."""
    straight = _start_straight_runs(project, {"ddp": SPEC})
    (project / "hot.yaml").write_text("name: hot\nextends: ./preempt-test.yaml\nfast_tier:\n  enabled: true\n"
                                      "vetting:\n  enabled: true\n  relative_speed: 0\n")
    spec = {**SPEC, "hold_at": 3, "project": str(project / "hot"), "out": str(project / "hot.pt")}
    info = submit(project, "-p", "./hot.yaml", "-N", "2", "--ntasks-per-node", "1", "--spare-nodes", "1", "-J", "hot",
                  "resume_worker.py", "--", json.dumps(spec))
    progress, jobid = project / "hot" / "progress", Path(info["job_dir"]) / "tasks" / "0.jobid"
    _wait_until("3 steps", lambda: progress.exists() and progress.read_text().strip() == "3", 240)
    victim = (project / "hot" / "host-a0-r1").read_text()  # not the first node, where the batch script runs
    try:
        subprocess.run([str(SLURM_LOCAL), "kill-node", victim], check=True, capture_output=True)
        (project / "hot" / "go").write_text("")  # the step run again passes step 3 (rank 0 held there till the loss)
        proc = hpc(project, "wait", info["job_id"], timeout=240)
        logs = hpc(project, "logs", "--all", info["job_id"], check=True).stdout
        said = "\n".join(line for line in logs.splitlines() if "hpc:" in line)
        assert proc.returncode == 0 and "COMPLETED" in proc.stdout, proc.stdout + said
        spare = (project / "hot" / "host-a0-r1").read_text()  # rank 1's node in the step run again
        assert spare != victim and f"stopped answering: replaced ({victim} by {spare}); the step runs again" in logs, \
            said
        assert jobid.read_text().split()[1] == "0", jobid.read_text()  # never requeued
        assert "(step 2, the peer tier)" in logs, said  # rank 1's folder, from the copy the other node kept
        assert_same_run(_straight_results(project, straight)["ddp"], torch.load(project / "hot.pt",
                                                                                  weights_only=False))
        replaced = status(project, info["job_id"])["replaced_nodes"]
        assert [(r["lost"], r["by"]) for r in replaced] == [(victim, spare)], replaced
        report = json.loads(hpc(project, "report", "--json", info["job_id"], check=True).stdout)
        (recovery,) = report["tasks"][0]["recoveries"]
        assert (recovery["lost"], recovery["spare"], recovery["tier"]) == ([victim], spare, "peer"), recovery
        assert report["totals"]["redone_steps"] == 1, report["totals"]  # step 3: the fast tier had step 2
    finally:  # idempotent: nothing happens if it is back already
        subprocess.run([str(SLURM_LOCAL), "revive-node", victim], capture_output=True, timeout=180)


def test_a_controller_that_stops_answering_as_a_task_fails_does_not_make_a_live_node_lost(project, slurm):
    """Rank 0 fails while rank 1 sleeps (no end of its own), and the controller stops answering at once, as a
    busy one does: srun's kill of the step and a probe of rank 1's node would wait for it, and a probe failing
    then proves nothing. The job script probes only once `scontrol ping` answers: while the controller is
    stopped no probe runs; once it answers, the node answers its probe, and the job ends FAILED, its node not
    taken for lost and the job not requeued (it once was, and ran again to COMPLETED)."""
    job = Job(project, "paused", {**SPEC, "crash_at": 5, "crash_rank": 0, "block_at": 5, "block_rank": 1}, [],
              ["-N", "2", "--ntasks-per-node", "1"])
    _wait_until("rank 0 to fail", (project / "paused" / "crashed_at").exists, 240)
    controller = _controller_pid(slurm)
    os.kill(controller, signal.SIGSTOP)
    try:  # past the moment the job script would probe rank 1's node (lost_nodes.after: 6 s; at once if settled)
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            assert not _probing(), "a node was probed while the controller did not answer"
            time.sleep(0.2)
    finally:
        os.kill(controller, signal.SIGCONT)
    proc = hpc(project, "wait", job.id, timeout=240)
    logs = hpc(project, "logs", "--all", job.id, check=True).stdout
    assert proc.returncode != 0 and "FAILED" in proc.stdout, proc.stdout + logs[-3000:]
    assert "stopped answering" not in logs and "requeued" not in logs, logs[-3000:]
    assert not status(project, job.id).get("lost_nodes"), status(project, job.id)
    assert job._restarts() == 0


def _probing() -> bool:
    """Whether a job script is probing a node (`srun --overlap -N1 -n1 -w NODE true`)."""
    found = subprocess.run(["pgrep", "-f", "srun --overlap -N1 -n1 -w .* true"], capture_output=True, text=True)
    return found.returncode == 0


@pytest.mark.parametrize("requeue", [False, True], ids=["ends", "requeues"])
def test_a_hung_rank_is_named_with_every_stack_and_the_job_ends_or_requeues_long_before_torchs_timeout(project,
                                                                                                     requeue):
    """Rank 1 of a 2-node job stops advancing (sleeps in Python); rank 0 waits for it in a collective. With
    hang_timeout 10 s the job ends within a minute, not after gloo's 30 minutes; with hang_requeue it runs again
    and resumes from the newest checkpoint."""
    spec = {**SPEC, "block_at": 5, "block_rank": 1}
    straight = _start_straight_runs(project, {"ddp": SPEC}) if requeue else None
    flags = ["-N", "2", "--ntasks-per-node", "1", "--hang-timeout", "10"] + (["--set", "hang_requeue=true"]
                                                                            if requeue else [])
    job = Job(project, "hang", spec, [], flags)
    blocked = project / "hang" / "blocked_at"
    _wait_until("rank 1 to block", blocked.exists, 240)
    summary_file = Path(job.info["job_dir"]) / "hang" / "0" / "summary.txt"
    _wait_until("the watchdog's summary", summary_file.exists, 60)
    assert time.time() - float(blocked.read_text()) < 45
    summary = summary_file.read_text()
    host1 = (project / "hang" / "host-a0-r1").read_text()
    assert f"rank 1 on {host1} is not in a collective" in summary, summary
    if requeue:
        _wait_results([job], 300)
        done = _finish(project, job, _straight_results(project, straight)["ddp"])
        assert [a[0] for a in done["result"]["attempts"]] == [0, 1]
        assert "requeued SLURM job" in done["logs"] and "(hang" in done["logs"], done["logs"]
    else:
        proc = hpc(project, "wait", job.id, timeout=120)
        logs = hpc(project, "logs", "--all", job.id, check=True).stdout
        assert proc.returncode != 0 and "FAILED" in proc.stdout, proc.stdout + logs[-3000:]
        assert time.time() - float(blocked.read_text()) < 60
        stacks = summary_file.parent
        assert "train" in (stacks / "rank1.stack").read_text()  # where rank 1 is stuck (py-spy or faulthandler)
        # rank 0 waits for it in its next collective (the gradient reduction of its next backward)
        assert "waits in a collective" in summary.split("rank 0 on", 1)[1], summary
        assert "backward" in (stacks / "rank0.stack").read_text()
        assert logs.count("the stacks of its threads") >= 2, logs[-3000:]  # both dumps are in the job's logs
        assert "requeued" not in logs
        assert status(project, job.id)["hang"] == summary.strip()
