"""`hpc report`'s recoveries and checkpoint tiers on recorded timelines (hpc/contract/recovery.py).

The common case first: a real elastic node loss on slurm-local (tests/unit/recorded/elastic_kill_tasks: the
timeline and sacct's row as `hpc report` reads them, and what was measured outside hpc: the kill's time, torchrun's
agent's failure line, the worker's own clock at each step and at its first step at the smaller world). Each
figure of its recovery is held against those. Then a requeue after a kill and after a graceful stop, and the
timeline fields of the checkpoint tiers (which node was lost and which spare took its place, the tier a resume
read, the tier each save went to, the fast tier's counts), with older timelines' reports unchanged."""

import json
import re
from pathlib import Path

import pytest

from hpc.cluster import report, report_html
from hpc.contract import goodput, recovery, timeline
from hpc.slurm.commands import ATTEMPT_FIELDS, parse_fields

RECORDED = Path(__file__).parent / "recorded"


def _recorded(name: str) -> tuple[list[goodput.Attempt], dict]:
    folder = RECORDED / name
    rows = parse_fields((folder / "sacct").read_text(), ATTEMPT_FIELDS)
    attempts = goodput.build(timeline.parse((folder / "timeline").read_text()), report.allocations(rows, None))
    return attempts, json.loads((folder / "outside.json").read_text())


def _report(*tasks: dict) -> dict:
    return {"version": report.VERSION, "job_id": "3", "name": "el", "profile": "slurm-local", "state": "COMPLETED",
            "exit_code": 0, "job_dir": "/x", "submitted_at": None, "reported_at": 0.0, "tasks": list(tasks),
            "totals": report.summed([t["totals"] for t in tasks])}


def _adds_up(r: dict) -> None:
    assert sum(r[p] for p in recovery.PARTS) == pytest.approx(r["total_s"], abs=1e-9)
    assert r["total_s"] == pytest.approx(r["training_at"] - r["commit_at"], abs=1e-9)
    assert all(r[p] >= 0 for p in recovery.PARTS), r


@pytest.mark.parametrize("name, kind, new", [("elastic_kill_tasks", "elastic restart", "a0-r1"),
                                             ("elastic_kill_node", "elastic restart", "a0-r1"),
                                             ("requeue_lost_node", "requeue", "a1-r1")])
def test_a_recorded_node_loss_has_each_part_where_the_outside_clocks_put_it(name, kind, new):
    attempts, seen = _recorded(name)
    (r,) = recovery.recoveries(attempts)
    _adds_up(r)
    assert r["kind"] == kind
    before = [(s, t) for a, s, t in seen["steps"] if a == "a0-r0"]
    after = seen["worlds"][f"world-{new}"]
    # redone: the lost run's last step (the worker's own count) minus the step the new run resumed from
    assert r["resumed_from"] == after["step"] - 1
    assert r["redone_steps"] == before[-1][0] - r["resumed_from"] == 1
    # the last step as the survivors' exit lines noted it: the worker's clock at that step, to the ms
    assert r["last_step_from"] == "exit line" and r["last_step_at"] == pytest.approx(before[-1][1], abs=0.005)
    # the checkpoint resumed from was committed after its step and before the next one
    step_t = dict(before)
    assert step_t[r["resumed_from"]] <= r["commit_at"] <= step_t[r["resumed_from"] + 1]
    assert r["redone_s"] == pytest.approx(r["last_step_at"] - r["commit_at"])
    # noticed after the kill, by a survivor's exception, before torchrun's agent logged the failure
    assert r["detected_by"] == "exception (RuntimeError)"
    assert r["last_step_at"] < seen["killed"] < r["detected_at"] <= (seen["agent_failed"] or r["detected_at"])
    # training again: the new run's first work, just before the worker's first step at the smaller world ended
    assert r["training_at"] <= after["trained_at"] <= r["training_at"] + 0.1
    assert r["restart_s"] > r["startup_s"] > r["load_s"] > 0  # the relaunch or the requeue is the largest part
    assert r["tier"] is None and r["lost"] == []  # this runtime's lines name neither: nothing is made up
    new_run = attempts[1]
    if kind == "elastic restart":  # the goodput's restart phase, then the new processes' start before `started`
        assert r["restart_s"] == pytest.approx(new_run.phase_seconds()["restart"] + new_run.started_at
                                               - new_run.proc_start_at, abs=1e-6)
    else:  # the old allocation's end (sacct's), the queue, the new one's start to `started`
        assert r["released_at"] == attempts[0].end and r["queued_s"] == new_run.start - attempts[0].end > 0
        assert r["detected_at"] < r["released_at"] < new_run.start < r["started_at"]


def test_the_text_and_the_page_show_the_recovery_row_and_the_totals():
    attempts, _ = _recorded("elastic_kill_tasks")
    task = report.task_dict("0", "COMPLETED", attempts)
    out = report.text(_report(task))
    row = next(line for line in out.splitlines() if line.startswith("  0 -> 0 restart 1"))
    assert re.search(r"elastic restart\s+exception \(RuntimeError\)\s+1 step\(s\) 0\.51\s+0\.55\s+7\.84\s+1\.18\s+"
                     r"0\.01\s+10\.09$", row), row
    assert "resumed from 2, loaded in 0.01 s" in out
    assert "checkpoints: 15 save(s) to the shared tier, 0.09 s stalled" in out
    assert "recoveries: 1, 10.1 s from checkpoint to training again (redone 0.5, detection 0.6, restart 7.8, " \
           "startup 1.2)" in out
    page = report_html.page(_report(task))
    assert 'id="recoveries"' in page and "<td>10.09</td>" in page and 'id="tiers"' in page
    tot = task["totals"]
    assert tot["recoveries"] == 1 and tot["recovery_s"] == pytest.approx(task["recoveries"][0]["total_s"])
    assert tot["saves"] == 15 and tot["fast_saves"] == 0
    both = report.summed([tot, tot])  # an array's tasks: summed
    assert both["recoveries"] == 2 and both["recovery_restart_s"] == pytest.approx(2 * tot["recovery_restart_s"])


def _line(t, attempt, event, **fields):
    return json.dumps({"t": t, "attempt": attempt, "event": event, **fields}) + "\n"


SACCT = "7|7|PENDING|990|1000|1100|2|node[1-2]\n7|7|COMPLETED|1120|1120|1200|2|node[1-2]\n"


def _two(*lines):
    return goodput.build(timeline.parse("".join(lines)), report.allocations(parse_fields(SACCT, ATTEMPT_FIELDS), 985))


def test_a_requeue_after_a_kill_is_detected_at_the_schedulers_end_and_its_restart_holds_the_queue():
    """Killed without a line (GraceTime 0): the last step known is the last progress line's (said so), the
    fault is known when SLURM ended the attempt, the restart holds the requeue's 20 s in the queue."""
    attempts = _two(
        _line(1006.0, 0, "started", nodes=2, world=2, step=0), _line(1010.0, 0, "training", step=0),
        _line(1040.0, 0, "save", step=20, stall_s=1.5, folder="c/20"), _line(1060.0, 0, "progress", step=40),
        _line(1126.0, 1, "started", nodes=2, world=2, step=0), _line(1129.0, 1, "resumed", step=20, load_s=0.8),
        _line(1130.0, 1, "training", step=20), _line(1190.0, 1, "finished", step=60, last_step_t=1189.0))
    (r,) = recovery.recoveries(attempts)
    _adds_up(r)
    assert (r["kind"], r["detected_by"], r["last_step_from"]) == ("requeue", "scheduler's end", "progress line")
    assert (r["redone_s"], r["detection_s"], r["restart_s"], r["startup_s"]) == (20.0, 40.0, 26.0, 4.0)
    assert r["queued_s"] == 20.0 and r["redone_steps"] == 20 and r["load_s"] == 0.8
    phases = attempts[0].phase_seconds()  # goodput's phases of the same moments
    assert (phases["redone"], phases["stopping"]) == (r["redone_s"], r["detection_s"])


def test_a_graceful_stop_loses_nothing_before_its_stop():
    """USR1 before the time limit: the loop stops at a step boundary with a checkpoint of that step. Nothing is
    redone and nothing waited to be noticed; the recovery is the requeue and the start-up."""
    attempts = _two(
        _line(1006.0, 0, "started", nodes=2, world=2, step=0), _line(1010.0, 0, "training", step=0),
        _line(1060.0, 0, "progress", step=40), _line(1090.0, 0, "signal", why="USR1"),
        _line(1092.0, 0, "save", step=55, stall_s=1.0, folder="c/55"),
        _line(1092.5, 0, "stopped", step=55, why="USR1", requeued=True),
        _line(1093.0, 0, "ended", step=55, last_step_t=1091.0, how="exit"),
        _line(1126.0, 1, "started", nodes=2, world=2, step=0), _line(1129.0, 1, "resumed", step=55, load_s=0.8),
        _line(1130.0, 1, "training", step=55))
    (r,) = recovery.recoveries(attempts)
    _adds_up(r)
    assert r["redone_steps"] == 0 and r["redone_s"] == 0 and r["detection_s"] == 0
    assert r["detected_by"] == "signal USR1" and r["commit_at"] == 1092.0
    assert (r["restart_s"], r["startup_s"]) == (34.0, 4.0)


def test_a_hang_is_noticed_when_the_watchdog_declares_it():
    attempts = _two(
        _line(1006.0, 0, "started", nodes=2, world=2, step=0), _line(1010.0, 0, "training", step=0),
        _line(1040.0, 0, "save", step=20, stall_s=1.0, folder="c/20"), _line(1045.0, 0, "progress", step=25),
        _line(1048.0, 0, "ended", step=26, last_step_t=1047.0, how="exception", error="ValueError", rank="1"),
        _line(1077.0, 0, "hang", step=26, idle_s=30.0),  # rank 0 waits in the all-reduce rank 1 never joined
        _line(1126.0, 1, "started", nodes=2, world=2, step=0), _line(1129.0, 1, "resumed", step=20, load_s=0.8),
        _line(1130.0, 1, "training", step=20))
    (r,) = recovery.recoveries(attempts)
    _adds_up(r)
    assert (r["detected_by"], r["last_step_at"], r["detection_s"]) == ("hang watchdog", 1047.0, 30.0)


def _tiers_timeline() -> list[goodput.Attempt]:
    """The checkpoint tiers' lines: a fast save every step (counted in each progress line), a shared save
    drained from the fast tier, one that fell back to the shared tier; node2 lost and the spare node3 in its
    place, the new run reading the newest step from a peer's copy."""
    fast = {"step": 10, "n": 10, "stall_s": 0.5, "busy_s": 3.0, "replicas": ["node1", "node2"]}
    return goodput.build(timeline.parse("".join([
        _line(1002.0, 0, "started", proc_start=1001.0, nodes=3, run_nodes=2, world=2, step=0,
              hosts=["node1", "node2"]),
        _line(1004.0, 0, "training", step=0),
        _line(1014.0, 0, "progress", step=10, fast=fast),
        _line(1015.0, 0, "save", step=10, stall_s=0.0, folder="c/step-10", tier="shared", **{"from": "node"}),
        _line(1024.0, 0, "progress", step=20, fast={**fast, "step": 20}),
        _line(1025.0, 0, "save", step=20, stall_s=2.0, folder="c/step-20", tier="shared", fallback="fast tier full"),
        _line(1026.0, 0, "ended", step=21, last_step_t=1025.9, how="exception", error="DistBackendError"),
        _line(1030.0, 0, "started", proc_start=1028.0, nodes=3, run_nodes=2, world=2, step=0,
              hosts=["node1", "node<3>"]),  # the spare, known by its hosts as hpc writes them
        _line(1031.0, 0, "resumed", step=21, load_s=0.4, tier="peer", folder="/dev/shm/c/step-21"),
        _line(1031.5, 0, "training", step=21),
        _line(1041.5, 0, "progress", step=31, fast={"step": 31, "n": 10, "stall_s": 0.25, "busy_s": 1.5,
                                                     "replicas": 2}),
        _line(1050.0, 0, "ended", step=40, last_step_t=1049.0, how="exit"),
    ])), report.allocations(parse_fields("9|9|COMPLETED|990|1000|1060|3|node[1-3]\n", ATTEMPT_FIELDS), 985))


def test_the_tiers_each_save_went_to_each_resume_read_and_the_spare_are_in_the_report():
    first, second = attempts = _tiers_timeline()
    (r,) = recovery.recoveries(attempts)
    _adds_up(r)
    assert (r["lost"], r["spare"], r["tier"], r["folder"]) == (["node2"], "node<3>", "peer", "/dev/shm/c/step-21")
    assert r["redone_steps"] == 0 and r["redone_s"] == 0  # the fast tier held the last step
    assert r["detection_s"] == pytest.approx(0.1) and r["restart_s"] == 4.0 and r["startup_s"] == 1.5
    assert [(s["tier"], s["from"], s["fallback"]) for s in first.saves] == [
        ("shared", "node", None), ("shared", None, "fast tier full")]
    assert first.fast == {"saves": 20, "stall_s": 1.0, "busy_s": 6.0, "step": 20, "replicas": ["node1", "node2"]}
    # the fast tier's stall is the loop's: checkpoint time, not training; the parts still add up
    assert first.phase_seconds()["checkpoint"] == pytest.approx(2.0 + 1.0)
    assert second.phase_seconds()["checkpoint"] == pytest.approx(0.25)
    for a in attempts:
        assert sum(a.phase_node_seconds().values()) == pytest.approx(a.allocated_node_s)
    tot = goodput.totals(attempts)
    assert (tot["saves"], tot["save_fallbacks"], tot["fast_saves"]) == (2, 1, 30)
    assert tot["fast_stall_s"] == pytest.approx(1.25) and tot["fast_busy_s"] == pytest.approx(7.5)
    assert tot["loop_s"] == pytest.approx((1025.9 - 1004.0) + (1049.0 - 1031.5))

    task = report.task_dict("0", "COMPLETED", attempts)
    out = report.text(_report(task))
    assert "step 10 +15.0s (0.00 s, shared from node)" in out
    assert "step 20 +25.0s (2.00 s, shared (fallback: fast tier full))" in out
    assert ("fast tier: 20 save(s), 1.00 s stalled, 6.00 s of writer-thread work beside the loop, newest at step 20 "
            "on 2 node(s) (node[1-2])") in out
    assert "resumed from 21, read from the peer tier in 0.40 s" in out
    assert "elastic restart, node2 lost, spare node<3>" in out and "0.40 (peer)" in out
    assert ("1 of them because the fast tier was full; fast tier 30 save(s), 1.25 s stalled (3.2%), its writer "
            "thread at work 7.50 s beside the loop") in out
    page = report_html.page(_report(task))
    assert "node&lt;3&gt;" in page and "node<3>" not in page
    assert "fast tier full" in page and 'fill="#b00020"><title>checkpoint at step 20' in page
    data = json.loads(json.dumps(_report(task)))
    assert data["tasks"][0]["recoveries"][0]["tier"] == "peer"
    assert data["tasks"][0]["attempts"][1]["resumed_tier"] == "peer" and data["totals"]["fast_saves"] == 30


def test_a_timeline_of_an_earlier_hpc_says_no_tier_and_its_figures_are_todays():
    """No tier keys, no hosts, no fast counts: the report's figures are those it gave before the tiers."""
    (a,) = goodput.build(timeline.parse("".join([
        _line(1002.0, 0, "started", nodes=2, world=2, step=0), _line(1004.0, 0, "training", step=0),
        _line(1015.0, 0, "save", step=10, stall_s=1.0), _line(1020.0, 0, "progress", step=12),
        _line(1030.0, 0, "finished", step=20, last_step_t=1029.0)])), span=(1000.0, 1040.0))
    assert a.fast is None and a.run_hosts == [] and a.saves[0]["tier"] is None and a.resumed_tier is None
    assert a.phase_seconds()["checkpoint"] == 1.0 and a.phase_seconds()["training"] == 24.0
    out = report.text(_report(report.task_dict("0", "COMPLETED", [a])))
    assert "fast tier" not in out and "recoveries" not in out and "(1.00 s)" in out


def test_attempts_without_a_timeline_have_a_recovery_without_parts():
    attempts = goodput.build([], report.allocations(parse_fields(SACCT, ATTEMPT_FIELDS), None))
    (r,) = recovery.recoveries(attempts)
    assert r["kind"] == "requeue" and r["total_s"] is None and all(r[p] is None for p in recovery.PARTS)
    task = report.task_dict("0", "COMPLETED", attempts)
    assert task["totals"]["recoveries"] == 1 and task["totals"]["recovery_s"] == 0
    assert re.search(r"  0 -> 1\s+requeue\s+-\s+0 step\(s\) -\s+-\s+-", report.text(_report(task)))
    assert "<td>requeue</td>" in report_html.page(_report(task))


def test_the_fast_tiers_stall_is_counted_not_drawn_so_a_days_progress_lines_stay_a_few_segments():
    lines = [_line(1000.0, 0, "started", nodes=1, world=1, step=0), _line(1001.0, 0, "training", step=0)]
    lines += [_line(1001.0 + 10 * i, 0, "progress", step=i, fast={"step": i, "n": 5, "stall_s": 0.02})
              for i in range(1, 1001)]
    lines.append(_line(11020.0, 0, "ended", step=1000, last_step_t=11011.0, how="exit"))
    (a,) = goodput.build(timeline.parse("".join(lines)), span=(1000.0, 11030.0))
    assert len(a.segments) == 3  # startup, training, ending
    assert a.phase_seconds()["checkpoint"] == pytest.approx(20.0)
    assert a.phase_seconds()["training"] == pytest.approx(10010.0 - 20.0)
    assert goodput.totals([a])["fast_saves"] == 5000
