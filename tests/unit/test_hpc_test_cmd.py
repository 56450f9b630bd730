"""`hpc test`: bad input, and the cross-rank verdict on hand-written rank files (the real sanity jobs:
tests/test_hpc_test_cmd.py)."""

import pytest

from hpc.cli.test_cmd import judge
from tests.jobhelpers import hpc

CHECKS = ["world size", "distinct ranks", "process group", "all-reduce sum", "broadcast from rank 0",
          "all-gather order", "training step", "barrier", "job ended"]


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
