"""A 2-node batch-inference job on the on-machine SLURM, preempted twice by a high-tier job: it ends COMPLETED with
every item's output present exactly once, no chunk committed twice, and `hpc status` counting the items."""

import json
import shutil
from pathlib import Path

import pytest

from tests.jobhelpers import hpc, status, submit
from tests.test_cluster_failures_slurm import _preempt_all_nodes, _wait_until, exclusive_profile
from tests.test_preemption_slurm import project  # noqa: F401
from tests.unit.test_batch_inference import WORKER, expected, outputs

pytestmark = pytest.mark.slurm


def _ledger(path: Path) -> list[tuple[int, int, str, int]]:
    """(attempt, rank, host, chunk) per commit."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [(int(a), int(r), h, int(c)) for a, r, h, c in (line.split() for line in lines)]


def _commits_in(ledger: Path, attempt: int) -> int:
    return sum(1 for a, *_ in _ledger(ledger) if a == attempt)


def test_a_two_node_batch_job_preempted_twice_writes_each_output_exactly_once(project):
    shutil.copy(WORKER, project)
    grace = exclusive_profile(project, "grace", "partition: lowgrace")
    ledger = project / "ledger"
    # the first two attempts sleep 0.25 s a chunk (each is preempted mid-way); the third runs straight through
    spec = {"out": str(project / "scores"), "items": 600, "chunk_size": 5, "sleep": 0.25, "sleep_attempts": 2,
            "ledger": str(ledger)}
    info = submit(project, "-p", grace, "-N", "2", "--ntasks-per-node", "1", "-J", "scores", "batch_worker.py",
                  "--", json.dumps(spec))
    for attempt in (0, 1):
        _wait_until(f"4 commits in attempt {attempt}", lambda: _commits_in(ledger, attempt) >= 4, 240)
        if attempt == 1:  # mid-job, hpc status already counts what the first attempt committed
            items = status(project, info["job_id"])["items"]
            assert items["total"] == 600 and items["done"] >= 5 * _commits_in(ledger, 0), items
        _preempt_all_nodes(project)
    done = hpc(project, "wait", info["job_id"], timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    commits = _ledger(ledger)
    assert sorted(c for *_, c in commits) == list(range(120))  # every chunk committed, none twice
    assert {a for a, *_ in commits} == {0, 1, 2}, commits
    assert len({h for a, _, h, _ in commits if a == 0}) == 2  # both nodes worked
    assert outputs(project / "scores") == expected(600)
    assert json.loads((project / "scores" / "manifest.json").read_text())["complete"] is True
    assert status(project, info["job_id"])["items"] == {"done": 600, "total": 600}
    text = hpc(project, "status", info["job_id"], check=True).stdout
    assert "COMPLETED" in text and "items: 600 of 600 done (100%)" in text, text
    logs = hpc(project, "logs", "--all", info["job_id"], check=True).stdout
    assert logs.count("stop requested (TERM)") >= 2 and "committed chunks kept" in logs, logs
