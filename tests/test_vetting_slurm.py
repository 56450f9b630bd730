"""Bad nodes and stalled jobs on the on-machine SLURM: vetting starts a job on its good nodes (a spare taking the
bad one's place, or a requeue without it), a job that stops advancing stops requeueing, and the webhook hears of
each. `scripts/slurm-local bad-node NODE` makes a node's health check fail while SLURM still takes it as healthy."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SLURM_LOCAL
from tests.jobhelpers import TOKEN, Webhook, hpc, status, submit
from tests.test_cluster_failures_slurm import _wait_until

pytestmark = pytest.mark.slurm
HERE = Path(__file__).parent
HELLO = HERE.parent / "scripts" / "examples" / "hello_ranks.py"
# each rank says where it runs and what SLURM says the job holds now; with "requeue-once" rank 0 asks to run again
ALLOCATION = """import os, socket, subprocess, sys
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("SLURM_RESTART_COUNT", "0"))
held, count = subprocess.run(["squeue", "-h", "-j", os.environ["SLURM_JOB_ID"], "-o", "%N %D"],
                             capture_output=True, text=True, check=True).stdout.split()
print(f"rank={rank} host={socket.gethostname()} attempt={attempt} holds={held} nodes={count}", flush=True)
if rank == 0 and attempt == 0 and sys.argv[1:] == ["requeue-once"]:
    with open(os.environ["HPC_REQUEUE_FILE"], "w") as f:
        f.write("the test asks once")
"""


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.server.shutdown()


@pytest.fixture
def project(slurm, tmp_path):
    shutil.copy(HELLO, tmp_path)
    (tmp_path / "allocation.py").write_text(ALLOCATION)
    shutil.copy(HERE / "stall_worker.py", tmp_path)
    shutil.copy(HERE / "straggler_worker.py", tmp_path)
    # windows of 4 steps, however short: a 16-step job is judged 4 times
    (tmp_path / "windows.yaml").write_text("name: windows\nextends: slurm-local\n"
                                           "env:\n  HPC_STRAGGLER_WINDOW_STEPS: '4'\n  HPC_STRAGGLER_WINDOW_S: '0'\n")
    # relative_speed 0: the nodes share this machine's CPUs, so under load one measures at 40% of another for no
    # reason of its own (CI saw it); which node is slow is judged in tests/unit, and here only bad nodes count
    (tmp_path / "vetted.yaml").write_text("name: vetted\nextends: slurm-local\n"
                                          "vetting:\n  enabled: true\n  relative_speed: 0\n"
                                          "preemption:\n  max_requeues: 3\n  max_attempts_without_progress: 1\n")
    try:
        yield tmp_path
    finally:
        for node in ("node1", "node2", "node3"):
            subprocess.run([str(SLURM_LOCAL), "good-node", node], capture_output=True, timeout=60)
        subprocess.run([str(SLURM_LOCAL), "fast-node", "node2"], capture_output=True, timeout=60)


def _bad(node: str) -> None:
    subprocess.run([str(SLURM_LOCAL), "bad-node", node], check=True, capture_output=True, timeout=60)


def _ranks_hosts(logs: str) -> set[str]:
    return {w.split("=", 1)[1] for line in logs.splitlines() for w in line.split() if w.startswith("host=")}


def test_a_spare_takes_a_bad_nodes_place_and_without_one_the_job_requeues_without_it(project, webhook):
    _bad("node2")
    # one spare: the job asks for 3 nodes and starts at once on the 2 good ones
    spared = submit(project, "-p", "./vetted.yaml", "-N", "2", "--spare-nodes", "1", "--notify", webhook.url,
                    "allocation.py")
    done = hpc(project, "wait", spared["job_id"], timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = hpc(project, "logs", "--all", spared["job_id"], check=True).stdout
    assert _ranks_hosts(logs) == {"node1", "node3"}, logs
    assert "node node2 excluded: health_check" in logs and "requeued" not in logs, logs
    # the left-out node went back to the cluster before the ranks started (node1 runs the job script)
    assert "vetting: released node(s) node2 to the cluster" in logs and "holds=node[1,3]" in logs, logs
    info = status(project, spared["job_id"])
    assert [n["node"] for n in info["excluded_nodes"]] == ["node2"], info
    assert "excluded node(s): node2 (vetting: health_check" in hpc(project, "status", spared["job_id"],
                                                                     check=True).stdout
    assert webhook.events() == ["node_excluded", "started", "completed"], webhook.messages
    assert "node2" in webhook.messages[0]["text"] and all(TOKEN not in json.dumps(m) for m in webhook.messages)

    # no spare: with node3 busy for a few seconds, SLURM gives the job node1 and node2; vetting finds too few fit
    # nodes, and the job runs again without node2 (the requeue excludes it)
    _block(project, "node3", 6)
    plain = submit(project, "-p", "./vetted.yaml", "-N", "2", "hello_ranks.py")
    done = hpc(project, "wait", plain["job_id"], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = hpc(project, "logs", "--all", plain["job_id"], check=True).stdout
    assert "vetting: fewer than 2 nodes fit to run" in logs and "next attempt excludes node2" in logs, logs
    assert _ranks_hosts(logs) == {"node1", "node3"}, logs


def test_a_requeued_job_whose_spare_went_back_asks_for_it_again(project):
    """Vetting gives the spare back to the cluster for the attempt; the requeued job gets N + K nodes again, and
    vets them all (on a SLURM that started it on N, the next attempt would have no spare)."""
    job = submit(project, "-p", "./vetted.yaml", "-N", "2", "--spare-nodes", "1", "--set", "hot_spares=false",
                 "allocation.py", "--", "requeue-once")
    done = hpc(project, "wait", job["job_id"], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = hpc(project, "logs", "--all", job["job_id"], check=True).stdout
    assert "requeued SLURM job" in logs and logs.count("released node(s)") == 2, logs
    for attempt in (0, 1):  # every rank of each attempt (2 nodes, 2 ranks a node) saw a job of two nodes
        counts = [line.split("nodes=")[1] for line in logs.splitlines() if f"attempt={attempt} holds=" in line]
        assert counts == ["2"] * 4, logs
    # each attempt vetted all three nodes: "starting on A, B (node1 ... GB/s, node2 ..., node3 ...)"
    vetted = [line for line in logs.splitlines() if "vetting: starting on" in line]
    assert len(vetted) == 2 and all(line.count(" GFLOP/s") == 3 for line in vetted), vetted


def test_spares_that_slurm_will_not_release_stay_allocated_and_the_job_runs_on_n(project):
    """A site may refuse to shrink a running job (a stand-in scontrol does, here): the log says so and why, the
    spare stays allocated, idle, and the job runs on its N chosen nodes all the same."""
    shims = project / "shims"
    shims.mkdir()
    (shims / "scontrol").write_text('#!/bin/bash\ncase " $* " in *" NodeList="*)\n'
                                    '  echo "scontrol: error: resizing is off at this site" >&2; exit 1 ;;\nesac\n'
                                    f'exec {shutil.which("scontrol")} "$@"\n')
    (shims / "scontrol").chmod(0o755)
    path = {"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    job = submit(project, "-p", "./vetted.yaml", "-N", "2", "--spare-nodes", "1", "--set", "hot_spares=false",
                 "allocation.py", env=path)
    done = hpc(project, "wait", job["job_id"], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = hpc(project, "logs", "--all", job["job_id"], check=True).stdout
    assert "vetting: could not release node(s)" in logs and "resizing is off at this site" in logs, logs
    assert "they stay allocated, idle" in logs and "released node(s)" not in logs, logs
    counts = [line.split("nodes=")[1] for line in logs.splitlines() if "holds=" in line]
    assert counts == ["3"] * 4 and len(_ranks_hosts(logs)) == 2, logs


def _block(project, node: str, seconds: int) -> None:
    """A short job on `node`, so the next job is given the other nodes."""
    subprocess.run(["sbatch", "-w", node, "-J", "blocker", f"--output={project}/blocker-%j.out", "--wrap",
                    f"sleep {seconds}"], check=True, capture_output=True)


def test_a_spare_job_that_excludes_nodes_runs_again_on_fewer_than_n_plus_k(project):
    """Excluded nodes stay excluded for the job's life: a job of N + K nodes whose partition has fewer left would
    pend for ever. N=1, K=1, node1 busy: the job gets node2 and node3, both bad; it requeues excluding them and
    asks for 1 to 2 nodes, and runs on node1, the only one left."""
    _bad("node2")
    _bad("node3")
    _block(project, "node1", 6)
    job = submit(project, "-p", "./vetted.yaml", "-N", "1", "--spare-nodes", "1", "allocation.py")
    done = hpc(project, "wait", job["job_id"], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = hpc(project, "logs", "--all", job["job_id"], check=True).stdout
    assert "next attempt excludes node2,node3" in logs and _ranks_hosts(logs) == {"node1"}, logs
    assert "attempt=1 holds=node1 nodes=1" in logs, logs


def test_a_job_whose_exclusions_leave_too_few_nodes_ends_saying_so_instead_of_pending(project):
    """N=2, K=1 on 3 nodes, two of them bad: a requeue without them would leave the partition 1 node for a job
    of 2, and pend for ever; the job ends FAILED at once and says why."""
    _bad("node2")
    _bad("node3")
    job = submit(project, "-p", "./vetted.yaml", "-N", "2", "--spare-nodes", "1", "allocation.py")
    done = hpc(project, "wait", job["job_id"], timeout=240)
    assert done.returncode != 0
    text = hpc(project, "status", job["job_id"]).stdout
    assert "FAILED" in text, text
    assert "without node(s) node2,node3 the partition has 1 node(s), fewer than the job's 2" in text, text
    assert "rank=" not in hpc(project, "logs", "--all", job["job_id"], check=True).stdout


def test_a_job_that_names_its_nodes_does_not_requeue_excluding_one_of_them(project):
    """-w node1,node2 with node2 bad: a requeue excluding node2 could never start (SLURM holds it pending,
    BadConstraints); the job ends FAILED and says why."""
    _bad("node2")
    job = submit(project, "-p", "./vetted.yaml", "-N", "2", "-w", "node1,node2", "allocation.py")
    done = hpc(project, "wait", job["job_id"], timeout=240)
    assert done.returncode != 0
    text = hpc(project, "status", job["job_id"]).stdout
    assert "FAILED" in text and "the job asks for node(s) node2 by name (nodelist node1,node2)" in text, text


def test_a_job_whose_checkpoint_stops_advancing_stops_requeueing(project, webhook):
    """max_attempts_without_progress 1: the first attempt saves step 1 and asks to run again; the second saves
    nothing new and asks again: the job ends FAILED, saying so, instead of requeueing up to max_requeues."""
    job = submit(project, "-p", "./vetted.yaml", "-N", "1", "--ntasks-per-node", "1", "--set", "vet=false",
                 "--notify", webhook.url, "stall_worker.py")
    done = hpc(project, "wait", job["job_id"], timeout=240)
    assert done.returncode != 0
    text = hpc(project, "status", job["job_id"]).stdout
    assert "FAILED" in text and "no progress in the last attempt (1)" in text and "step 1" in text, text
    assert webhook.events() == ["started", "requeued", "failed"], webhook.messages
    assert "no progress" in webhook.messages[-1]["text"]


def test_a_job_on_a_slow_node_names_it(project, webhook):
    """Once the ranks are set up, node2 gets 15% of a CPU (a cgroup quota): its rank's own part of each step takes
    several times rank 0's, and the straggler check names rank 1 on node2 in the log, hpc status and a notice; the
    job still completes. (At 40% a busy machine slowed rank 0 nearly as much, and nothing was named.)"""
    go = project / "go"
    job = submit(project, "-p", "./windows.yaml", "-N", "2", "--nproc", "1", "-w", "node1,node2", "--notify",
                 webhook.url, "straggler_worker.py", "--", "12", str(go))
    _wait_until("the ranks to be set up", lambda: all(Path(f"{go}.ready{rank}").exists() for rank in (0, 1)), 180)
    subprocess.run([str(SLURM_LOCAL), "slow-node", "node2", "15"], check=True, capture_output=True, timeout=60)
    go.touch()
    done = hpc(project, "wait", job["job_id"], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = hpc(project, "logs", "--all", job["job_id"], check=True).stdout
    assert "hpc: straggler: rank 1 on node2 takes" in logs and "finished" in logs, logs
    assert "straggler: rank 1 on node2" in hpc(project, "status", job["job_id"], check=True).stdout
    assert "straggler" in webhook.events() and webhook.events()[-1] == "completed", webhook.messages
