"""`hpc report` of a real job on the on-machine SLURM: 2 nodes, preempted once without grace time (SLURM kills
and requeues it), resumed from its last periodic checkpoint. The report has both attempts, the steps trained
after that checkpoint as redone, a goodput below 1 whose parts add up to each attempt's allocation (sacct's
start and end) within a second, the same in JSON, and a page whose timeline draws both attempts on both nodes."""

import json
import time

import pytest

from tests.jobhelpers import hpc
from tests.test_cluster_failures_slurm import _preempt_all_nodes, exclusive_profile
from tests.test_preemption_slurm import Job, project  # noqa: F401

pytestmark = pytest.mark.slurm
# saves at step 8 and 16. In the first attempt rank 1 stops answering at step 12 (rank 0 waits for it in the next
# step's all-reduce), so SLURM's TERM finds no step boundary to save at and KillWait's KILL ends the attempt: the
# next resumes from step 8, and steps 9-12 are trained again
SPEC = {"strategy": "ddp", "steps": 20, "save_every": 8, "sleep": 0.25, "sleep_attempts": 1, "block_at": 12,
        "block_rank": 1}
ENV = {"HPC_TIMELINE_EVERY_S": "0.5"}  # the killed attempt's last step known to half a second


def test_a_job_preempted_once_has_two_attempts_redone_steps_and_a_goodput_that_adds_up(project, tmp_path):
    profile = exclusive_profile(project, "nograce", "partition: low")
    submitted = json.loads(hpc(project, "submit", "--json", "-p", profile, "-N", "2", "--ntasks-per-node", "1",
                               "-J", "rep", "resume_worker.py", "--",
                               json.dumps({**SPEC, "project": str(project / "rep"), "out": str(project / "rep.pt")}),
                               env=ENV, check=True).stdout)
    job = submitted["job_id"]
    progress = project / "rep" / "progress"
    deadline = time.monotonic() + 60
    while not (progress.exists() and progress.read_text().strip() and int(progress.read_text()) >= 12):
        assert time.monotonic() < deadline, "the job did not reach step 12"
        time.sleep(0.2)
    _preempt_all_nodes(project)
    assert hpc(project, "wait", job, "--timeout", "75", timeout=90).returncode == 0

    data = json.loads(hpc(project, "report", "--json", job, check=True).stdout)
    (task,) = data["tasks"]
    first, second = task["attempts"][:1] + task["attempts"][-1:]
    assert len(task["attempts"]) >= 2, task["attempts"]  # a busy machine may preempt the restart once more
    assert first["nodes"] == 2 and len(first["hosts"]) == 2
    assert first["training_at"] and first["saves"][0]["step"] == 8
    assert second["resumed_from"] == 8
    assert first["step_to"] >= 11 and first["redone_steps"] == first["step_to"] - 8  # known to half a second
    assert data["totals"]["redone_steps"] >= 3
    for a in task["attempts"]:
        parts = sum(a["node_s"].values())
        assert abs(parts - a["allocated_node_s"]) <= a["nodes"] * 1.0, a  # within a second per attempt
        assert a["allocated_node_s"] == pytest.approx(a["nodes"] * (a["end"] - a["start"]))
    assert 0 < data["totals"]["goodput"] < 1
    assert data["totals"]["node_s"]["redone"] > 0 and data["totals"]["node_s"]["checkpoint"] > 0

    out = hpc(project, "report", job, "--html", str(tmp_path / "report.html"), check=True).stdout
    assert "attempt 0:" in out and "attempt 1:" in out and "goodput" in out, out
    page = (tmp_path / "report.html").read_text()
    for a in task["attempts"][:2]:
        for host in a["hosts"]:
            assert f"attempt {a['attempt']} {host}" in page
    assert 'class="phase-redone"' in page and 'class="mark-save"' in page

    bad = hpc(project, "report", "no-such-job")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr

