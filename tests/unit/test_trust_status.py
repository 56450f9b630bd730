"""No false success, without a cluster (issue 22): the batch script's requeue through a controller that does not
answer (the real script, SLURM's commands faked on PATH), hpc's own requeue count, why a job ended as
`hpc status` tells it (recorded job folders), and `hpc wait`/`submit`/`list` through an outage.
(The same paths against the real on-machine SLURM: tests/test_trust_slurm.py.)"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc.cluster import backends, status
from hpc.cluster.backends import base
from hpc.cluster.backends.slurm import SlurmBackend
from hpc.cluster.config import precedence
from hpc.cluster.records import JobRecord
from hpc.cluster.render import render
from hpc.contract import layout
from hpc.errors import HpcError
from hpc.slurm.commands import ControllerDown, Slurm, check_fits
from tests.unit.test_slurm_recorded import Recorded

REPO = Path(__file__).resolve().parents[2]
TIMED_OUT = "slurm_load_jobs error: Socket timed out on send/recv operation"

# SLURM's commands as the batch script uses them. The controller "does not answer" while $FAKE/down exists
# (ping fails; a requeue fails with what scontrol 22.05 prints then); $FAKE/down holds how many more
# questions it stays down for (empty: for good). Every call is logged in $FAKE/calls.
FAKE_SCONTROL = r"""#!/bin/bash
echo "$*" >> "$FAKE/calls"
down() {
  [ -e "$FAKE/down" ] || return 1
  left=$(cat "$FAKE/down")
  if [ -n "$left" ]; then
    [ "$left" -gt 0 ] || { rm -f "$FAKE/down"; return 1; }
    echo $((left - 1)) > "$FAKE/down"
  fi
}
case "$1 $2" in
  "show hostnames") echo node1 ;;
  "ping "*) if down; then echo "Slurmctld(primary) at vm is DOWN"; exit 1; fi; echo "Slurmctld(primary) at vm is UP" ;;
  "requeue "*)
    if down; then echo "Unexpected message received for job $2" >&2; exit 1; fi
    if [ -e "$FAKE/refuse" ]; then cat "$FAKE/refuse" >&2; exit 1; fi
    touch "$FAKE/requeued" ;;
  "show job") if down; then echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2; exit 1; fi
              echo "JobId=$3 JobState=RUNNING Reason=None"
              echo "   PreemptTime=$(cat "$FAKE/preempt_time" 2>/dev/null || echo None) SuspendTime=None" ;;
  *) echo "fake scontrol: $*" >&2; exit 1 ;;
esac
"""
# srun runs the task here, as rank 0 on node1; sleep is quick (the script's pauses and its 1 s polls)
FAKE_SRUN = """#!/bin/bash
while [ "${1#--}" != "$1" ]; do shift; done
SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURMD_NODENAME=node1 exec "$@"
"""
FAKE_SLEEP = "#!/bin/bash\nexec /bin/sleep 0.05\n"
# the job's program: asks to run again (as a rank does after the warning signal) unless told otherwise
PROGRAM = """#!/bin/bash
if [ -n "$ASK_REQUEUE" ]; then echo "$ASK_REQUEUE" > "$HPC_REQUEUE_FILE"; fi
exit "${EXIT:-0}"
"""


def batch_script(tmp_path, monkeypatch, patience=1) -> tuple[Path, Path]:
    """The real batch script of a 1-task job (its controller patience cut to ``patience`` s) and its folder."""
    monkeypatch.setattr("hpc.cluster.backends.slurm.CONTROLLER_PATIENCE_S", patience)
    job_dir = tmp_path / "job"
    effective = precedence.resolve("slurm-local", [precedence.flag_layer(
        {"command": [str(tmp_path / "program")], "nodes": 1, "ntasks_per_node": 1})])
    script = tmp_path / "job.sbatch"
    script.write_text(render(effective, job_dir, backend=backends.for_profile(effective.profile)).script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in [("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN), ("sleep", FAKE_SLEEP)]:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "program").write_text(PROGRAM)
    (tmp_path / "program").chmod(0o755)
    return script, job_dir


def run_batch(tmp_path, script: Path, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPC_"))}
    full.update({"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FAKE": str(tmp_path),
                 "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node1", **env})
    return subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=60, check=False)


def task_file(job_dir: Path, kind: str) -> Path:
    return Path(layout.JobFolder(job_dir).task("0", kind))


def test_a_requeue_rides_out_a_controller_that_does_not_answer_and_counts_once(tmp_path, monkeypatch):
    """The ranks saved and asked to run again; the first requeue meets a controller that does not answer: the
    script says so once, asks again until it answers, and the job is requeued (not COMPLETED at step 7 of 48)."""
    script, job_dir = batch_script(tmp_path, monkeypatch, patience=30)
    (tmp_path / "down").write_text("3")  # two requeues and a ping go unanswered
    proc = run_batch(tmp_path, script, ASK_REQUEUE="USR1")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "requeued").exists()
    assert proc.stderr.count("the SLURM controller does not answer") == 1, proc.stderr
    assert "hpc: requeued SLURM job 77 (USR1)" in proc.stderr
    assert task_file(job_dir, layout.TaskFile.REQUEUED).read_text().strip() == "1"
    assert not task_file(job_dir, layout.TaskFile.REASON).exists()


def test_a_requeue_that_never_goes_through_ends_the_job_failed_with_the_reason(tmp_path, monkeypatch):
    script, job_dir = batch_script(tmp_path, monkeypatch, patience=1)
    (tmp_path / "down").write_text("")  # for good
    proc = run_batch(tmp_path, script, ASK_REQUEUE="USR1")
    assert proc.returncode == 1, proc.stderr  # the ranks exited 0, but the work is not done
    assert not (tmp_path / "requeued").exists()
    reason = task_file(job_dir, layout.TaskFile.REASON).read_text()
    assert reason.startswith("asked to run again (USR1), but the requeue did not go through: the SLURM "
                             "controller did not answer for "), reason
    assert "Unexpected message received for job 77" in reason
    assert task_file(job_dir, layout.TaskFile.REQUEUED).read_text().strip() == "0"  # taken back
    assert task_file(job_dir, layout.TaskFile.EXIT).read_text().strip() == "1"


def test_a_refused_requeue_ends_at_once_and_a_lost_answer_that_went_through_counts_as_requeued(tmp_path,
                                                                                             monkeypatch):
    script, job_dir = batch_script(tmp_path, monkeypatch, patience=300)
    (tmp_path / "refuse").write_text("Requested operation is presently disabled for job 77\n")
    started = time.monotonic()
    proc = run_batch(tmp_path, script, ASK_REQUEUE="USR1")
    assert proc.returncode == 1 and time.monotonic() - started < 20, proc.stderr  # the patience is not spent
    assert "presently disabled" in task_file(job_dir, layout.TaskFile.REASON).read_text()
    # a requeue that timed out but reached the controller: asked again, SLURM says the job waits to run again
    (tmp_path / "refuse").write_text("Job is pending execution for job 77\n")
    (tmp_path / "down").write_text("1")
    proc = run_batch(tmp_path, script, ASK_REQUEUE="USR1")
    assert proc.returncode == 0 and "hpc: requeued SLURM job 77" in proc.stderr, proc.stderr
    assert task_file(job_dir, layout.TaskFile.REQUEUED).read_text().strip() == "1"


def test_a_preemption_requeue_does_not_count_against_max_requeues(tmp_path, monkeypatch):
    """SLURM chose the job for preemption and the ranks stopped on its TERM (exit 143): the script requeues it,
    but hpc's count (what max_requeues limits) stays where it was."""
    script, job_dir = batch_script(tmp_path, monkeypatch)
    (tmp_path / "preempt_time").write_text("2026-11-22T16:00:05")
    proc = run_batch(tmp_path, script, EXIT="143")
    assert proc.returncode == 0 and "(preempted at 2026-11-22T16:00:05)" in proc.stderr, proc.stderr
    assert not task_file(job_dir, layout.TaskFile.REQUEUED).exists()
    # the next time the ranks ask (the warning signal), that is hpc's first requeue
    proc = run_batch(tmp_path, script, ASK_REQUEUE="USR1")
    assert proc.returncode == 0 and task_file(job_dir, layout.TaskFile.REQUEUED).read_text().strip() == "1"


# --- the ranks' side: hpc's own count, and a refusal noted for `hpc status` ------------------------------------

def test_max_requeues_counts_hpcs_requeues_not_slurms(tmp_path, monkeypatch):
    from hpc.runtime.resilience import preemption

    requeue_file = tmp_path / "tasks" / "0.requeue"
    requeue_file.parent.mkdir()
    monkeypatch.setenv("HPC_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("HPC_TASK", "0")
    monkeypatch.setenv("HPC_REQUEUE_FILE", str(requeue_file))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "5")  # preempted five times by the cluster
    monkeypatch.delenv("HPC_RESTART_COUNT", raising=False)
    assert preemption.requeue(3, "USR1") == (True, "the job script will requeue it")
    assert preemption.requeue_count() == 5 and preemption.hpc_requeue_count() == 0
    task_file(tmp_path, layout.TaskFile.REQUEUED).write_text("3\n")  # the job script's count
    requeued, said = preemption.requeue(3, "USR1")
    assert not requeued and said == ("not requeued (USR1): hpc has requeued it 3 times (max_requeues=3; "
                                     "preemptions do not count)")
    assert task_file(tmp_path, layout.TaskFile.REASON).read_text() == said + "\n"


# --- why a job ended: `hpc status` over recorded job folders ------------------------------------------------

def ended_job(tmp_path, ends=None, reason=None, exit_code=None, launcher="srun") -> JobRecord:
    """A finished job's folder as the batch script leaves it: each process's end (code, seconds after the first),
    the reason file, the script's exit code."""
    folder = tmp_path / "job"
    (folder / layout.TASKS).mkdir(parents=True)
    (folder / layout.RUNTIME_CONFIG).write_text(json.dumps({"launcher": launcher}))
    now = time.time()
    for (host, rank), (code, after) in (ends or {}).items():
        path = folder / layout.TASKS / f"0.{layout.TaskFile.END}.{host}.{rank}"
        path.write_text(f"{code}\n")
        os.utime(path, (now + after, now + after))
    if reason is not None:
        task_file(folder, layout.TaskFile.REASON).write_text(reason)
    if exit_code is not None:
        task_file(folder, layout.TaskFile.EXIT).write_text(f"{exit_code}\n")
    return JobRecord(job_id="42", scheduler="slurm", profile="p", name="train", job_dir=str(folder),
                     submitted_at=now - 60, argv=[], workdir=str(tmp_path), script="job.sbatch")


def slurm_says(sacct_state="FAILED", exit_code="0:0") -> SlurmBackend:
    start = int(time.time())
    return SlurmBackend(Slurm(Recorded([
        (["squeue"], (1, "", "slurm_load_jobs error: Invalid job id specified\n")),
        (["scontrol", "show", "config"], (0, "AccountingStorageType = accounting_storage/slurmdbd\n", "")),
        (["env", "SLURM_TIME_FORMAT=%s", "sacct"], (0, f"42|42|{sacct_state}|{exit_code}|{start}\n", ""))])))


@pytest.fixture
def no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))


def test_the_rank_that_failed_first_gives_the_exit_code_not_the_peers_srun_stopped(tmp_path, no_cache):
    """Rank 2 raised (exit 1); srun then stopped the others (exit 143), and the script's own code is srun's."""
    job = ended_job(tmp_path, exit_code=143, ends={("node1", 0): (143, 0.4), ("node1", 1): (143, 0.4),
                                                   ("node2", 2): (1, 0.0), ("node2", 3): (143, 0.5)})
    state = slurm_says().states([job])[job.job_dir]["0"]
    assert (state.state, state.exit_code) == ("FAILED", 1)
    assert state.reason == "rank 2 on node2 failed first (exit 1)"
    assert status.exit_code({"0": state}) == 1  # what `hpc wait` exits with


def test_a_tie_in_time_goes_to_the_process_that_was_not_stopped_and_torchrun_names_its_agent(tmp_path, no_cache):
    job = ended_job(tmp_path, exit_code=143, launcher="torchrun",
                    ends={("node1", 0): (143, 0.0), ("node2", 1): (1, 0.0)})
    state = slurm_says().states([job])[job.job_dir]["0"]
    assert state.reason == "torchrun's agent on node2 (node 1) failed first (exit 1)" and state.exit_code == 1


def test_a_node_lost_in_this_attempt_is_blamed_before_the_survivor_that_failed_after_it(tmp_path, no_cache):
    """The elastic job's node2 died (no end noted there, the batch script noted it lost); node1's agent failed
    later. A node lost in an earlier attempt (lost_nodes older than this attempt's jobid) is not blamed."""
    job = ended_job(tmp_path, exit_code=1, launcher="torchrun", ends={("node1", 0): (1, 0.0)},
                    reason="node(s) node2 stopped answering; not requeued: hpc requeued the job 3 times\n")
    folder = Path(job.job_dir) / layout.TASKS
    (folder / f"0.{layout.TaskFile.JOBID}").write_text("42 3\n")
    lost = folder / f"0.{layout.TaskFile.LOST_NODES}"
    lost.write_text("node3\nnode2\n")
    state = slurm_says().states([job])[job.job_dir]["0"]
    assert state.reason.startswith("node(s) node2 left first: no process there noted an end (killed, or the node "
                                   "died); then torchrun's agent on node1 (node 0) failed (exit 1)"), state.reason
    replaced = folder / f"0.{layout.TaskFile.REPLACED}"
    replaced.write_text("node2 by node4\n")  # a hot spare took its place: the run that failed after never had it
    state = slurm_says().states([job])[job.job_dir]["0"]
    assert state.reason.startswith("torchrun's agent on node1 (node 0) failed first (exit 1)"), state.reason
    replaced.unlink()
    os.utime(lost, (time.time() - 30, time.time() - 30))  # lost before this attempt began
    state = slurm_says().states([job])[job.job_dir]["0"]
    assert state.reason.startswith("torchrun's agent on node1 (node 0) failed first (exit 1)"), state.reason


def test_a_job_that_was_not_requeued_says_why(tmp_path, no_cache):
    """max_requeues spent: every rank saved and exited 128+USR1; the reason is the ranks' note."""
    note = "not requeued (USR1): hpc has requeued it 3 times (max_requeues=3; preemptions do not count)\n"
    job = ended_job(tmp_path, exit_code=138, reason=note * 2,  # two ranks wrote the same
                    ends={("node1", 0): (138, 0.0), ("node2", 1): (138, 0.1)})
    state = slurm_says().states([job])[job.job_dir]["0"]
    assert state.reason == ("every process ended with exit 138 = 128+SIGUSR1; not requeued (USR1): hpc has "
                            "requeued it 3 times (max_requeues=3; preemptions do not count)")


def test_a_failure_with_no_process_to_blame_and_a_timeout_with_a_pending_requeue(tmp_path, no_cache):
    job = ended_job(tmp_path, exit_code=2)
    assert slurm_says().states([job])[job.job_dir]["0"].reason == (
        "the job script ended with exit code 2 and no process noted why; see `hpc logs --all`")
    pending = "asked to run again (USR1), but the requeue had not gone through when the job ended\n"
    job = ended_job(tmp_path / "t", reason=pending, ends={("node1", 0): (0, 0.0)})
    state = slurm_says("TIMEOUT", "0:15").states([job])[job.job_dir]["0"]
    assert (state.state, state.reason) == ("TIMEOUT", pending.strip())


def test_hpc_status_and_wait_print_the_reason(tmp_path, monkeypatch):
    """The CLI end to end, on a recorded job folder: SLURM's commands answer from files on PATH."""
    job = ended_job(tmp_path, exit_code=143, ends={("node1", 0): (143, 0.3), ("node2", 1): (1, 0.0)})
    env = fake_slurm_env(tmp_path, squeue=(1, "slurm_load_jobs error: Invalid job id specified"),
                         sacct=f"42|42|FAILED|0:0|{int(time.time())}")
    record_job(job, env, monkeypatch)
    out = hpc_cli(env, "status", "42")
    assert out.returncode == 0, out.stderr
    assert "FAILED (exit 1)" in out.stdout and "why: rank 1 on node2 failed first (exit 1)" in out.stdout
    info = json.loads(hpc_cli(env, "status", "--json", "42").stdout)
    assert info["reasons"] == {"0": "rank 1 on node2 failed first (exit 1)"} and info["exit_code"] == 1
    out = hpc_cli(env, "wait", "42")
    assert out.returncode == 1 and "why: rank 1 on node2 failed first" in out.stdout, out.stdout + out.stderr


# --- a controller that does not answer: submit, wait, list ---------------------------------------------------

def fake_slurm_env(tmp_path, squeue=(0, ""), sacct="", partition=None) -> dict:
    """SLURM's clients on PATH answering from fixed text; a private hpc home."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)

    def command(name, rc, out):
        (bin_dir / name).write_text(f"#!/bin/bash\n{'echo ' + json.dumps(out) + (' >&2' if rc else '')}\nexit {rc}\n")
        (bin_dir / name).chmod(0o755)

    command("squeue", *squeue)
    command("sacct", 0, sacct)
    command("scontrol", *(partition or (0, "AccountingStorageType = accounting_storage/slurmdbd")))
    command("sinfo", *(partition or (0, "(null)")))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_", "SLURM_"))}
    env.update({"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_CONF": str(tmp_path / "slurm.conf"),
                "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
                "XDG_CONFIG_HOME": str(tmp_path / "config"), "HF_HOME": str(tmp_path / "hf"),
                "PYTHONPATH": str(REPO), "HOME_FOR_TEST": str(tmp_path)})
    return env


def record_job(job: JobRecord, env: dict, monkeypatch) -> None:
    """Save the record where `hpc` (run with ``env``) finds its jobs."""
    from hpc.cluster import records as jobs

    monkeypatch.setenv("XDG_DATA_HOME", env["XDG_DATA_HOME"])
    jobs.save(job)


def hpc_cli(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc", *args], env=env, cwd=env["HOME_FOR_TEST"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_submit_during_an_outage_names_the_outage_not_a_missing_partition(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    env = fake_slurm_env(tmp_path, partition=(1, "slurm_load_partitions error: " + TIMED_OUT.split(": ")[1]))
    proc = hpc_cli(env, "submit", "-p", "slurm-local", "--no-snapshot", "train.py")
    assert proc.returncode == 2, proc.stderr
    assert "does not exist" not in proc.stderr
    assert ("the SLURM controller does not answer: slurm_load_partitions error: Socket timed out on send/recv "
            "operation") in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_partition_check_tells_an_outage_from_an_answer():
    timed_out = (1, "", "slurm_load_partitions error: Socket timed out on send/recv operation\n")
    down = Recorded([(["scontrol"], timed_out)])
    with pytest.raises(ControllerDown):
        check_fits(Slurm(down, retry_waits=(0, 0)), "debug", 1, "10", 0)
    assert len(down.calls) == 3  # asked again twice before the outage is the answer
    with pytest.raises(HpcError, match="partition 'gpu' does not exist"):
        check_fits(Slurm(Recorded([(["scontrol"], (1, "", "Partition gpu not found\n"))])), "gpu", 1, "10", 0)
    refused = (1, "", "sinfo: error: Unable to contact slurm controller (connect failure)\n")
    up = (0, "PartitionName=debug State=UP TotalNodes=3 MaxNodes=UNLIMITED MaxTime=UNLIMITED\n", "")
    with pytest.raises(ControllerDown):
        check_fits(Slurm(Recorded([(["scontrol"], up), (["sinfo"], refused)]), retry_waits=()), "debug", 1, "10", 1)


class Answers:
    """SLURM's answers in turn, one per call (the last one repeated); keeps the calls."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, argv):
        self.calls.append(list(argv))
        rc, out, err = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return subprocess.CompletedProcess(argv, rc, out, err)


def test_a_question_the_busy_controller_dropped_is_asked_again_but_a_request_never():
    timed_out = (1, "", "slurm_load_partitions error: Socket timed out on send/recv operation\n")
    up = (0, "PartitionName=debug State=UP TotalNodes=3 MaxNodes=UNLIMITED MaxTime=UNLIMITED\n", "")
    answers = Answers(timed_out, up)
    check_fits(Slurm(answers, retry_waits=(0, 0)), "debug", 2, "10", 0)  # the second try answers: no error
    assert len(answers.calls) == 2
    for request, argv in (("cancel", ["12"]), ("requeue", ["12"])):
        sent = Answers((1, "", "scancel: error: Socket timed out on send/recv operation\n"))
        with pytest.raises(ControllerDown):
            getattr(Slurm(sent, retry_waits=(0, 0)), request)(*argv)
        assert len(sent.calls) == 1, request  # it may have been carried out: never sent twice
    sent = Answers((1, "", "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\n"))
    with pytest.raises(ControllerDown):
        Slurm(sent, retry_waits=(0, 0)).submit_argv(["sbatch", "--parsable", "/j/job.sbatch"])
    assert len(sent.calls) == 1


def test_wait_rides_out_an_outage_says_so_once_and_is_bounded_by_its_timeout(tmp_path, no_cache, monkeypatch):
    job = ended_job(tmp_path, exit_code=0)
    answers = iter([ControllerDown(TIMED_OUT)] * 3 + [{"0": status.TaskState("RUNNING")}]
                   + [ControllerDown(TIMED_OUT)] * 2 + [{"0": status.TaskState("COMPLETED", 0)}])

    def states(record):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(status, "states", states)
    monkeypatch.setattr(status.Outage, "FIRST_PAUSE_S", 0.01)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    said = []
    assert status.wait(job, say=said.append) == {"0": status.TaskState("COMPLETED", 0)}
    assert [s.split(";")[0] for s in said if "not answering" in s] == ["controller not answering"]
    assert TIMED_OUT in said[0]
    assert said[1].startswith("the controller answers again")

    def down(record):
        raise ControllerDown(TIMED_OUT)

    monkeypatch.setattr(status, "states", down)
    with pytest.raises(TimeoutError, match="the SLURM controller has not answered"):
        status.wait(job, timeout=0.2, say=said.append)


def test_list_says_once_why_states_are_unknown(tmp_path, monkeypatch):
    env = fake_slurm_env(tmp_path, squeue=(1, TIMED_OUT))
    for n in (1, 2):
        record_job(ended_job(tmp_path / str(n)), env, monkeypatch)
    proc = hpc_cli(env, "list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("?") == 3, proc.stdout  # two rows and one footnote
    assert proc.stdout.strip().splitlines()[-1].startswith(
        f"? state unknown: the SLURM controller does not answer: {TIMED_OUT}; fix: "), proc.stdout


def test_first_failure_with_unknown_times_prefers_a_process_that_failed_by_itself():
    ends = [base.ProcessEnd(0, "node1", 143, None), base.ProcessEnd(3, "node2", 2, None)]
    assert base.first_failure(ends).rank == 3
    assert base.first_failure([base.ProcessEnd(0, "node1", 0, None)]) is None



def test_logs_follow_keeps_printing_through_an_outage_and_stops_when_the_job_ends(tmp_path, no_cache, monkeypatch,
                                                                                   capsys):
    job = ended_job(tmp_path)
    log = job.dir / layout.LOGS / "rank0-42.out"
    log.parent.mkdir()
    log.write_text("step 1\n")
    answers = iter([ControllerDown(TIMED_OUT), ControllerDown(TIMED_OUT), {"0": status.TaskState("COMPLETED", 0)}])

    def states(record):
        log.write_text(log.read_text() + "step 2\n")  # the job writes on while no one answers
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(status, "states", states)
    monkeypatch.setattr(status.Outage, "FIRST_PAUSE_S", 0.0)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    lines = [line for _, line in status.follow(job, lambda: [f"{layout.LOGS}/rank0-42.out"], keep_going=True)]
    assert lines == ["step 1", "step 2", "step 2", "step 2"]
    assert capsys.readouterr().err.count("hpc: controller not answering") == 1


def test_a_cancel_that_did_not_go_through_leaves_no_cancel_marker(tmp_path, no_cache):
    job = ended_job(tmp_path)
    down = SlurmBackend(Slurm(Recorded([(["scancel"], (1, "", f"scancel: error: {TIMED_OUT}\n"))])))
    with pytest.raises(ControllerDown):
        down.cancel(job)
    assert not job.marked(layout.CANCELLED)  # the job runs on: when it ends, it is not taken for cancelled


def test_when_every_process_that_noted_an_end_was_stopped_the_silent_one_is_blamed(tmp_path, no_cache):
    """node2's processes were killed (its agent too, the node alive: no lost node); srun then stopped node1's agent
    (143). The survivor is not the cause: the node that noted nothing is."""
    job = ended_job(tmp_path, exit_code=143, launcher="torchrun", ends={("node1", 0): (143, 0.0)})
    folder = Path(job.job_dir)
    (folder / layout.RUNTIME_CONFIG).write_text(json.dumps({"launcher": "torchrun", "nodes": 2}))
    state = slurm_says().states([job])[job.job_dir]["0"]
    assert state.reason.startswith("torchrun's agent of node(s) 1 noted no end: failed first (killed, or the node "
                                   "died); then torchrun's agent on node1 (node 0) was stopped (exit 143 = "
                                   "128+SIGTERM)"), state.reason
    srun = ended_job(tmp_path / "s", exit_code=143, ends={("node1", 0): (143, 0.0), ("node1", 1): (143, 0.0)})
    (Path(srun.job_dir) / layout.RUNTIME_CONFIG).write_text(json.dumps({"launcher": "srun", "nodes": 2,
                                                                        "nproc_per_node": 2}))
    assert slurm_says().states([srun])[srun.job_dir]["0"].reason.startswith(
        "rank(s) 2,3 noted no end: failed first")
    # one that failed by itself is still the first failure
    own = ended_job(tmp_path / "o", exit_code=1, ends={("node1", 0): (143, 0.2), ("node2", 1): (1, 0.0)})
    assert slurm_says().states([own])[own.job_dir]["0"].reason.startswith("rank 1 on node2 failed first (exit 1)")
