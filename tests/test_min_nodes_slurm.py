"""min_nodes on the real on-machine SLURM: a 3-node job with min_nodes 1 loses a node mid-run. Excluded for the
job's life, that node leaves the 3-node partition 2, fewer than the job's 3: instead of ending FAILED, the requeue
asks for 1 to 3 nodes, the next attempt runs on the nodes SLURM gives it (1: see below) and resumes from the
newest checkpoint at that world size, and the job ends COMPLETED with every epoch's samples trained exactly once.

(Three nodes, not two: slurm-local's partitions hold 3 nodes, so a 2-node job would need two nodes excluded
before it had fewer than 2 left, two requeues instead of one.)
"""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.jobhelpers import hpc, status, submit

pytestmark = pytest.mark.slurm
HERE = Path(__file__).parent
SLURM_LOCAL = HERE.parent / "scripts" / "slurm-local"


def _idle_nodes(conf: str) -> list[str]:
    idle = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-t", "idle", "-o", "%N"], capture_output=True,
                          text=True, env={**os.environ, "SLURM_CONF": conf})
    return idle.stdout.split()


def _wait_for(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_a_job_that_loses_a_node_runs_on_fewer_after_its_requeue_and_completes_exactly(slurm, tmp_path):
    for name in ("elastic_worker.py", "shape_worker.py"):  # the worker's sample log is shape_worker's
        shutil.copy(HERE / name, tmp_path)
    # the lost-node probes start 5 s after a task failed (20 s by default)
    (tmp_path / "shrink.yaml").write_text("name: shrink\nextends: slurm-local\nlost_nodes:\n  after: 5\n")
    run = tmp_path / "mn"
    spec = {"project": str(run), "out": str(tmp_path / "mn.pt"), "epochs": 2, "sleep": 0.5, "samples": 96}
    # all three nodes: one an earlier test killed may still be on its way back into service
    _wait_for("every node idle", lambda: len(_idle_nodes(slurm)) == 3, 180)
    info = submit(tmp_path, "-p", "./shrink.yaml", "-N", "3", "--ntasks-per-node", "1", "--min-nodes", "1",
                  "--time", "5", "-J", "mn", "elastic_worker.py", "--", json.dumps(spec))
    _wait_for("the first step at world 3", (run / "world-a0-r0").exists, 120)
    before = json.loads((run / "world-a0-r0").read_text())
    assert before["world"] == 3, before
    victim = before["hosts"][-1]  # not node1, which runs the batch script
    _wait_for("the first checkpoint", lambda: int((run / "progress").read_text() or 0) >= 3, 60)
    revive = None
    try:
        subprocess.run([str(SLURM_LOCAL), "kill-node", victim], check=True, capture_output=True)
        lost = Path(info["job_dir"]) / "tasks" / "0.lost_nodes"
        _wait_for("the lost node to be named", lost.exists, 90)
        # the node boots again while the job runs on without it (later tests want all 3 nodes)
        revive = subprocess.Popen([str(SLURM_LOCAL), "revive-node", victim], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        proc = hpc(tmp_path, "wait", info["job_id"], timeout=180)
        logs = hpc(tmp_path, "logs", "--all", info["job_id"], check=True).stdout
        assert proc.returncode == 0 and "COMPLETED" in proc.stdout, proc.stdout + logs[-4000:]
        after = json.loads(next(run.glob("world-a1-r*")).read_text())  # r: the requeue's SLURM restart count
        # MIN to 3 nodes with MIN's task count: SLURM 22.05 gives no more nodes than tasks, so MIN (1) here
        assert after["world"] < 3 and victim not in after["hosts"], after
        assert f"without node(s) {victim} the partition has 2 node(s): the job asks for 1 to 3" in logs, logs[-4000:]
        assert "this attempt runs on 3 of the job's 3 nodes" in logs, logs[-4000:]
        assert f"this attempt runs on {after['world']} of the job's 3 nodes" in logs, logs[-4000:]
        result = torch.load(tmp_path / "mn.pt", weights_only=False)
        for epoch, ids in enumerate(result["epochs"]):
            assert sorted(ids) == list(range(96)), f"epoch {epoch}: {sorted(ids)}"
        assert status(tmp_path, info["job_id"])["lost_nodes"] == [victim]
    finally:
        if revive is None:
            revive = subprocess.Popen([str(SLURM_LOCAL), "revive-node", victim])
        revive.wait(timeout=180)
