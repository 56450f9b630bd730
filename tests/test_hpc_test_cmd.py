"""`hpc test`: a real sanity job on the local profile and on the on-machine SLURM cluster, a real failure, and the
cross-rank verdict on hand-written rank files."""

import json
import re

import pytest

from hpc.cli.test_cmd import judge
from tests.jobhelpers import hpc

CHECKS = ["world size", "distinct ranks", "process group", "all-reduce sum", "broadcast from rank 0",
          "all-gather order", "training step", "barrier", "job ended"]


def test_local_two_processes_pass(tmp_path):
    proc = hpc(tmp_path, "test", "-p", "local", "--nproc", "2", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == ["ok"] * len(CHECKS)
    assert "ranks 0-1 on 1 host(s)" in proc.stdout and "gloo on cpu" in proc.stdout
    assert lines[-1].startswith("hpc test: passed (world 2 on 1 node, ")
    assert "waiting for it to end" in proc.stderr


def test_json_gives_every_check_and_one_process_needs_no_group(tmp_path):
    proc = hpc(tmp_path, "test", "--json", timeout=120, env={"HPC_PROFILE": "local"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert [c["name"] for c in data["checks"]] == CHECKS and all(c["ok"] for c in data["checks"])
    assert (data["passed"], data["failed"], data["world"], data["profile"]) == (True, None, 1, "local")
    assert data["checks"][2]["detail"] == "none needed (one process) on cpu"
    assert data["logs"].startswith(str(tmp_path / "hpc-jobs" / "hpc-test-"))


def test_a_network_interface_that_does_not_exist_fails_the_process_group(tmp_path):
    # A real failure, the commonest multi-node one: the profile names a NIC the nodes do not have, so gloo
    # cannot form the process group. Nothing here is faked; the job fails as it would on a cluster.
    (tmp_path / "badnic.yaml").write_text("extends: local\nname: badnic\nnetwork_interface: nosuchnic0\n")
    proc = hpc(tmp_path, "test", "-p", "./badnic.yaml", "--nproc", "2", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = proc.stdout.splitlines()[-1]
    assert verdict.startswith("hpc test: FAILED: process group: rank "), verdict
    assert "nosuchnic0" in verdict and f"; logs: {tmp_path}/hpc-jobs/hpc-test-" in verdict
    assert "ok    world size" in proc.stdout and "FAIL  job ended              FAILED (exit 1)" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["-N", "0"], "--nodes = 0"),
    (["-p", "nope"], "no profile named 'nope'"),
    (["--nproc", "-1"], "must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = hpc(tmp_path, "test", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "hpc-jobs").exists()


def _rank(rank, world=2, host="node1", stop_after=None, error=None, **values):
    checks = {}
    for name in CHECKS[2:-1]:
        if name == stop_after:
            break
        checks[name] = {"ok": True, "detail": "fine", "value": values.get(name)}
    return {"rank": rank, "world": world, "host": host, "checks": checks, "error": error}


def _first_failure(results, world=2, ended=(True, "COMPLETED")):
    checks = judge(results, world, ended)
    return next(((c["name"], c["detail"]) for c in checks if not c["ok"]), None)


def test_verdict_across_ranks():
    weights = {"training step": [0.5, 0.25]}
    good = [_rank(0, **{"broadcast from rank 0": 7}, **weights), _rank(1, **{"broadcast from rank 0": 7}, **weights)]
    assert _first_failure(good) is None
    # plain srun without rank variables: every process is rank 0 of a world of one
    assert _first_failure([_rank(0, world=1), _rank(0, world=1)]) == (
        "world size", "rank 0 on node1 saw world 1, expected 2")
    assert _first_failure([_rank(0), _rank(0)])[1] == "rank 0 seen 2 times; no result from rank(s) 1"
    # each rank passed its own check, yet they disagree
    split = [_rank(0, **{"broadcast from rank 0": 7}), _rank(1, **{"broadcast from rank 0": 8})]
    assert _first_failure(split) == ("broadcast from rank 0", "ranks got different values: [7, 8]")
    drift = [_rank(0, **{"training step": [0.5, 0.25]}), _rank(1, **{"training step": [0.5, 0.3]})]
    assert _first_failure(drift)[0] == "training step"
    # the check a rank died in carries its error; a rank that just stopped is blamed on how the job ended
    crashed = [_rank(0, stop_after="all-reduce sum", error="RuntimeError: boom"), _rank(1, stop_after="barrier")]
    assert _first_failure(crashed) == ("all-reduce sum", "rank 0: RuntimeError: boom")
    hung = [_rank(0, stop_after="barrier"), _rank(1, stop_after="barrier")]
    assert _first_failure(hung, ended=(False, "still running after 5 s; cancelled")) == (
        "barrier", "rank 0 did not get this far (job still running after 5 s; cancelled)")
    assert _first_failure([], ended=(False, "still PENDING after 5 s; cancelled")) == (
        "world size", "no rank wrote a result (job still PENDING after 5 s; cancelled)")


@pytest.mark.slurm
def test_two_nodes_on_the_slurm_cluster_pass(slurm, tmp_path):
    # others share the cluster: hpc test's own timeout (which cancels the job) comes before the subprocess's
    proc = hpc(tmp_path, "test", "-p", "slurm-local", "-N", "2", "--nproc", "1", "--timeout", "240", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"ranks 0-1 on 2 host\(s\): node\d, node\d\n", proc.stdout), proc.stdout  # others use nodes too
    assert proc.stdout.splitlines()[-1].startswith("hpc test: passed (world 2 on 2 nodes, ")
