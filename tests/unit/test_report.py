"""`hpc report`'s arithmetic on recorded files: a timeline of two attempts (the first preempted without grace time,
the second resumed from its step-20 checkpoint) laid over sacct's rows of the same job. The parts must add up to
the allocation, the steps trained after the resumed-from checkpoint are redone, and the page draws both attempts."""

import json
import re
import subprocess
import sys

import pytest

from hpc.cluster import report, report_html
from hpc.contract import goodput, timeline
from hpc.slurm.commands import ATTEMPT_FIELDS, parse_fields

# `SLURM_TIME_FORMAT=%s sacct -c -D -n -P -o JobID,JobIDRaw,State,Submit,Start,End,NNodes,NodeList` on slurm-local
# for a job preempted once (the requeued run's row says PENDING in the jobcomp file); a RESIZING row is skipped
SACCT = """\
7|7|PENDING|990|1000|1100|2|node[1-2]
7|7|RESIZING|1120|1120|1120|2|node[1-2]
7|7|COMPLETED|1120|1120|1200|2|node[1-2]
"""


def _line(t, attempt, event, **fields):
    return json.dumps({"t": t, "attempt": attempt, "event": event, **fields}) + "\n"


TIMELINE = "".join([
    _line(1006.0, 0, "started", batch_start=1000.5, nodes=2, world=2, step=0),
    _line(1010.0, 0, "training", step=0),
    _line(1011.0, 0, "progress", step=1),
    _line(1040.0, 0, "save", step=20, stall_s=1.5, **{"async": False}),
    _line(1060.0, 0, "progress", step=40),  # then SLURM killed it (GraceTime=0): no stop line
    _line(1126.0, 1, "started", batch_start=1120.2, nodes=2, world=2, step=0),
    _line(1129.0, 1, "resumed", step=20, load_s=0.8),
    _line(1130.0, 1, "training", step=20),
    _line(1131.0, 1, "progress", step=21),
    _line(1180.0, 1, "save", step=60, stall_s=2.0, **{"async": False}),
    _line(1190.0, 1, "finished", step=60),
    '{"t": 1195, "attempt": 1, "ev',  # a torn last line (a crash mid-write) is skipped
])


@pytest.fixture
def attempts():
    rows = parse_fields(SACCT, ATTEMPT_FIELDS)
    allocs = report.allocations(rows, since=985.0)
    return goodput.build(timeline.parse(TIMELINE), allocs, vetted={0: 1004.0}, submitted_at=990.0)


def test_two_attempts_their_parts_add_up_to_the_allocation(attempts):
    assert [a.number for a in attempts] == [0, 1]
    for a in attempts:
        assert sum(a.phase_node_seconds().values()) == pytest.approx(a.allocated_node_s, abs=1e-6)
        assert a.segments[0][1] == a.start and a.segments[-1][2] == a.end  # the phases cover the span
        assert all(s[2] == n[1] for s, n in zip(a.segments, a.segments[1:]))  # with no gap and no overlap
    first, second = attempts
    assert (first.allocated_node_s, second.allocated_node_s) == (200.0, 160.0)
    assert first.queued_s == 10.0 and second.queued_s == 20.0
    phases = first.phase_seconds()
    assert phases["vetting"] == 4.0 and phases["startup"] == 6.0
    assert phases["checkpoint"] == 1.5
    assert phases["training"] == pytest.approx(1038.5 - 1010.0)  # up to the step-20 save, its stall excluded
    assert phases["redone"] == 20.0  # from that save's commit to the last step recorded
    assert phases["stopping"] == 40.0  # the kill, KillWait, the requeue
    assert first.redone_steps == 20 and first.steps_trained == 40
    assert second.resumed_from == 20 and second.steps_trained == 40 and second.redone_steps == 0
    assert second.phase_seconds()["redone"] == 0


def test_goodput_below_one_and_the_totals_sum(attempts):
    tot = goodput.totals(attempts)
    assert tot["allocated_node_s"] == 360.0
    assert sum(tot["node_s"].values()) == pytest.approx(360.0)
    assert 0 < tot["goodput"] < 1
    assert tot["goodput"] == pytest.approx(tot["node_s"]["training"] / 360.0)
    assert tot["redone_steps"] == 20 and tot["steps_trained"] == 80 and tot["queued_s"] == 30.0


def test_reasons_say_how_each_attempt_ended(attempts):
    assert "killed after step 40" in attempts[0].reason and "requeued" in attempts[0].reason
    assert attempts[1].reason.startswith("work done")


def test_an_attempt_without_a_timeline_is_unrecorded_and_still_adds_up():
    allocs = report.allocations(parse_fields(SACCT, ATTEMPT_FIELDS), since=None)
    attempts = goodput.build([], allocs)
    assert [a.phase_seconds()["unrecorded"] for a in attempts] == [100.0, 80.0]
    assert goodput.totals(attempts)["goodput"] == 0


def test_a_running_attempt_is_reported_up_to_now_from_its_own_events():
    events = timeline.parse(TIMELINE)
    attempts = goodput.build(events, now=1200.0)
    assert attempts[-1].running and attempts[-1].end == 1200.0
    assert attempts[0].start == 1000.5  # the batch script's start, from the jobid file's time
    assert attempts[0].redone_steps == 20


def _report(attempts) -> dict:
    tot = goodput.totals(attempts)
    return {"version": report.VERSION, "job_id": "7", "name": "tr<a>in", "profile": "slurm-local",
            "state": "COMPLETED", "exit_code": 0, "job_dir": "/x", "submitted_at": 990.0, "reported_at": 1300.0,
            "tasks": [{"task": "0", "state": "COMPLETED", "attempts": [report.attempt_dict(a) for a in attempts],
                       "totals": tot}], "totals": report.summed([tot])}


def test_the_json_is_plain_data_with_its_documented_keys(attempts):
    data = json.loads(json.dumps(_report(attempts)))
    a = data["tasks"][0]["attempts"][0]
    for key in ("attempt", "queued_s", "start", "end", "vetted_at", "training_at", "first_step_at", "saves",
                "signal_at", "stopped_at", "steps_trained", "redone_steps", "reason", "node_s", "goodput", "segments"):
        assert key in a, key
    assert data["totals"]["redone_steps"] == 20


def test_the_text_names_both_attempts_the_redone_steps_and_the_goodput(attempts):
    out = report.text(_report(attempts))
    assert "attempt 0: node[1-2]" in out and "attempt 1: node[1-2]" in out
    assert "20 redone later" in out and "goodput" in out
    assert re.search(r"the rest \(node-seconds\): .*redone 40", out), out


def test_the_page_draws_a_row_per_attempt_and_node_and_escapes_what_the_job_wrote(attempts):
    page = report_html.page(_report(attempts))
    assert page.count("attempt 0 node") == 2 and page.count("attempt 1 node") == 2
    assert "tr&lt;a&gt;in" in page and "tr<a>in" not in page
    assert 'class="phase-redone"' in page and 'class="mark-save"' in page
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_report_loads_no_torch():
    """The login side never imports torch: `hpc report` neither (its page included)."""
    code = ("import sys; from hpc.cli import cli; import hpc.cluster.report, hpc.cluster.report_html\n"
            "try: cli.main(['report', '--help'], standalone_mode=False)\nexcept SystemExit: pass\n"
            "assert 'torch' not in sys.modules, 'torch loaded'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_the_completion_notice_carries_the_goodput_and_the_redone_steps(tmp_path, monkeypatch):
    from hpc.runtime.resilience import notify

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "0.timeline").write_text(TIMELINE)
    monkeypatch.setenv("HPC_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("HPC_TASK", "0")
    monkeypatch.setattr(notify.time, "time", lambda: 1200.0)  # the batch script's notice, as the step ended
    payload = notify.facts("completed", "the job's work is done")
    assert payload["redone_steps"] == 20 and 0 < payload["goodput"] < 1
    assert "step(s) redone" in payload["text"] and "goodput" in payload["text"]
    assert "goodput" not in notify.facts("requeued", "x")


# --- how a run ends, and elastic restarts inside one allocation ---------------------------------------------------
def _one_attempt(*lines, end=1100.0, state="COMPLETED"):
    rows = parse_fields(f"9|9|{state}|990|1000|{int(end)}|2|node[1-2]\n", ATTEMPT_FIELDS)
    return goodput.build(timeline.parse("".join(lines)), report.allocations(rows, since=985.0))


def test_a_script_that_returns_without_end_training_ended_and_was_not_killed():
    """Most Accelerate scripts return without end_training(): the exit is the run's end, its steps are counted up
    to the last one, training ends at that step and the time after it (a final evaluation, the exit) is the
    ending, not a stop (it read 'killed after step 1 (last recorded)', with everything after the first progress
    line under stopping)."""
    (a,) = _one_attempt(
        _line(1002.0, 0, "started", batch_start=1000.0, proc_start=1000.5, nodes=2, world=4, step=0),
        _line(1005.0, 0, "training", step=0),
        _line(1006.0, 0, "progress", step=1),  # the next progress line would have come 10 s on
        _line(1096.0, 0, "ended", step=4, last_step_t=1014.0, how="exit", rank="0"))
    assert a.reason == "ended after step 4; COMPLETED" and a.steps_trained == 4
    phases = a.phase_seconds()
    assert phases["training"] == 9.0 and phases["ending"] == 86.0 and phases["stopping"] == 0.0
    assert a.productive_node_s / a.allocated_node_s == pytest.approx(0.09)


def test_end_training_ends_training_at_its_last_step_and_a_noted_exception_does_not_fail_a_completed_job():
    (a,) = _one_attempt(
        _line(1002.0, 0, "started", proc_start=1000.5, nodes=2, world=4, step=0), _line(1005.0, 0, "training", step=0),
        _line(1040.0, 0, "finished", step=9, last_step_t=1030.0),  # then a final evaluation and push, 50 s
        _line(1090.0, 0, "ended", step=9, last_step_t=1030.0, how="exception", error="KeyError", rank="0"))
    assert a.reason == "work done; COMPLETED"
    assert a.phase_seconds()["training"] == 25.0 and a.phase_seconds()["ending"] == 70.0
    (b,) = _one_attempt(
        _line(1002.0, 0, "started", proc_start=1000.5, nodes=2, world=4, step=0), _line(1005.0, 0, "training", step=0),
        _line(1090.0, 0, "ended", step=9, last_step_t=1030.0, how="exception", error="KeyError", rank="0"))
    assert b.reason == "ended after step 9; COMPLETED"  # sys.last_value outlives a handled, printed exception


def test_an_exception_is_named_and_a_sigkill_is_still_the_last_recorded_step():
    base = [_line(1002.0, 0, "started", nodes=2, world=4, step=0), _line(1005.0, 0, "training", step=0),
            _line(1006.0, 0, "progress", step=1)]
    failed = _one_attempt(*base, _line(1050.0, 0, "ended", step=7, how="exception", error="ValueError", rank="2"),
                          state="FAILED")
    assert failed[0].reason.startswith("failed after step 7: ValueError")
    killed = _one_attempt(*base)
    assert killed[0].reason.startswith("killed after step 1 (last recorded)")
    assert killed[0].phase_seconds()["stopping"] == 94.0


def test_an_elastic_restart_inside_the_allocation_is_a_run_of_its_own_with_redone_steps_and_restart_time():
    """A 2-node --elastic 1:2 job lost a node at step 12 and went on from the step-10 checkpoint after ~45 s: it
    was reported as one run from step 10, nothing redone, the wait as training."""
    attempts = _one_attempt(
        _line(1002.0, 0, "started", proc_start=1001.0, nodes=2, run_nodes=2, world=2, step=0),
        _line(1004.0, 0, "training", step=0),
        _line(1004.5, 0, "progress", step=1),
        _line(1019.0, 0, "save", step=10, stall_s=0.5, folder="c/step-10"),
        _line(1022.0, 0, "ended", step=12, how="exception", error="RuntimeError", rank="0"),
        _line(1066.0, 0, "started", proc_start=1064.0, nodes=2, run_nodes=1, world=1, step=0),
        _line(1067.0, 0, "resumed", step=10, load_s=0.1),
        _line(1067.5, 0, "training", step=10),
        _line(1098.0, 0, "ended", step=40, last_step_t=1098.0, how="exit", rank="0"), end=1100)
    first, second = attempts
    assert [(a.number, a.run) for a in attempts] == [(0, 0), (0, 1)]
    assert (first.start, first.end, second.start, second.end) == (1000.0, 1022.0, 1022.0, 1100.0)
    assert first.step_to == 12 and first.redone_steps == 2 and first.reason.startswith("failed after step 12")
    assert "elastic restart" in first.reason and second.queued_s == 0.0
    assert second.resumed_from == 10 and second.steps_trained == 30
    tot = goodput.totals(attempts)
    assert tot["steps_trained"] == 42 and tot["redone_steps"] == 2
    assert second.phase_seconds()["restart"] == 42.0 and second.phase_seconds()["startup"] == 3.5
    assert first.phase_seconds()["redone"] == 3.0  # from the step-10 commit to the loss
    # the lost node stays allocated: the second run's other node is idle, not training
    assert second.phase_node_seconds()["training"] == 30.5 and second.phase_node_seconds()["idle_spares"] == 78.0
    for a in attempts:
        assert sum(a.phase_node_seconds().values()) == pytest.approx(a.allocated_node_s)
    assert tot["allocated_node_s"] == 200.0
    assert tot["goodput"] == pytest.approx((2 * (1019.0 - 0.5 - 1004.0) + 30.5) / 200.0)


def test_sacct_whole_seconds_do_not_cut_off_the_stop_and_a_skipped_duplicate_save_is_one_save():
    """SLURM's End is cut to the second: the stop and the requeue noted 0.9 s later belong to the attempt. A stop's
    save of a step the script had just saved to the same folder wrote nothing and is listed once."""
    (a,) = _one_attempt(
        _line(1002.0, 0, "started", nodes=2, world=4, step=0), _line(1005.0, 0, "training", step=0),
        _line(1099.2, 0, "save", step=9, stall_s=0.2, folder="c/step-9"),
        _line(1099.4, 0, "signal", why="USR1"),
        _line(1099.5, 0, "save", step=9, stall_s=0.001, folder="c/step-9"),
        _line(1099.9, 0, "stopped", step=9, why="USR1", requeued=True), end=1099)
    assert a.end == 1099.9 and a.signal_at == 1099.4 and a.stopped_at == 1099.9
    assert [s["step"] for s in a.saves] == [9]


def test_a_local_job_without_hpcs_runtime_is_one_unrecorded_attempt_with_its_state():
    """`hpc report` of the README's hello_ranks.py on the local profile said 'no attempt has started yet'."""
    (a,) = goodput.build([], None, span=(1000.0, 1008.0), state="COMPLETED")
    assert (a.start, a.end, a.reason) == (1000.0, 1008.0, "COMPLETED")
    assert a.phase_seconds()["unrecorded"] == 8.0
