"""The straggler check's rules without processes: what is timed (a step's own part, paused steps left out), the
threshold against the median rank (2 and 3 ranks), 2 windows in a row, each rank named once per attempt, the
windows' alignment (a resume mid-window, the counters moved), what rank 0 writes, and `hpc status`'s lines."""

import collections
import json
import math
import socket
from types import SimpleNamespace

import pytest
import torch

from hpc.cli.jobs_cmd import straggler_lines
from hpc.cluster.backends import base
from hpc.runtime.resilience import stragglers as st
from hpc.runtime.resilience.stragglers import Detector, StepTimer, Straggler, Stragglers, reference
from hpc.runtime.tracking import run_trackers as trackers

NAN = math.nan


def test_the_median_rank_is_the_lower_middle():
    assert reference([3.0, 1.0]) == 1.0  # 2 ranks: the faster one's, so the ratio is slow over fast
    assert reference([1.0, 5.0, 2.0]) == 2.0
    assert reference([4.0, 1.0, 3.0, 2.0]) == 2.0


@pytest.mark.parametrize("own, slow", [
    ([0.10, 0.16], {1: 1.6}),  # 2 ranks: 1.6x the faster one
    ([0.10, 0.14], {}),  # under the threshold
    ([0.25, 0.375], {1: 1.5}),  # at it
    ([0.10, 0.10, 0.30], {2: 3.0}),  # 3 ranks: against the middle one
    ([0.10, 0.30, 0.30], {}),  # two of three slow: the middle is slow too, no one stands out
    ([0.10, NAN, 0.30], {2: 3.0}),  # a rank that measured nothing is left out of the median
    ([NAN, 0.30], {}),  # one rank measured: nothing to compare with
])
def test_a_rank_is_slow_at_the_threshold_times_the_median_rank(own, slow):
    found = Detector(1.5).slow(own, [1.0] * len(own))
    assert found.keys() == slow.keys() and all(math.isclose(found[r], slow[r]) for r in slow)


def test_a_tiny_difference_is_no_straggler_whatever_the_ratio():
    detector = Detector(1.5)
    assert detector.slow([0.001, 0.005], [0.01, 0.01]) == {}  # 4 ms more: under MIN_EXCESS_S
    assert detector.slow([0.10, 0.20], [10.0, 10.0]) == {}  # 0.1 s more on a 10 s step: 1%, under MIN_COST
    assert detector.slow([0.10, 0.20], [1.0, 1.0]) == {1: 2.0}


def test_named_after_two_windows_in_a_row_and_once_per_attempt():
    detector = Detector(1.5)
    slow, fine = [0.1, 0.3], [0.1, 0.1]
    assert detector.window(slow, [1, 1], 20) == []
    assert detector.window(fine, [1, 1], 40) == []  # the streak is broken
    assert detector.window(slow, [1, 1], 60) == []
    assert detector.window(slow, [1, 1], 80) == [Straggler(1, pytest.approx(3.0), 80)]
    assert detector.window(slow, [1, 1], 100) == []  # named already in this attempt
    assert Detector(1.5).window(slow, [1, 1], 20) == []  # the next attempt starts afresh


def test_a_window_a_rank_measured_nothing_in_neither_counts_nor_breaks_its_streak():
    detector = Detector(1.5)
    assert detector.window([0.1, 0.1, 0.4], [1] * 3, 20) == []
    assert detector.window([0.1, 0.1, NAN], [1] * 3, 40) == []
    assert detector.window([0.1, 0.1, 0.4], [1] * 3, 60) == [Straggler(2, pytest.approx(4.0), 60)]


def _clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(st.time, "monotonic", lambda: now[0])

    def advance(seconds):
        now[0] += seconds
    return advance


def test_the_own_part_ends_at_the_last_backward_or_the_first_collective(monkeypatch):
    advance = _clock(monkeypatch)
    timer = StepTimer()
    timer.work()  # before the first step: nothing to time yet
    timer.step_done()  # the first step only starts the clock
    advance(0.2)
    timer.work()  # accumulate()
    advance(0.1)
    timer.work()  # backward(): DDP waits for the others in here
    advance(0.7)
    timer.step_done()
    advance(0.1)
    timer.collective()  # gather() before backward: the wait starts here
    advance(0.2)
    timer.work()
    advance(0.3)
    timer.step_done()
    advance(0.4)  # a loop that calls loss.backward() itself: the whole step
    timer.step_done()
    assert [round(x, 6) for x in timer.own] == [0.3, 0.1, 0.4]
    assert [round(x, 6) for x in timer.steps] == [1.0, 0.6, 0.4]
    assert timer.window() == (pytest.approx(0.3), pytest.approx(0.6))
    assert (timer.own, timer.steps) == ([], [])
    assert all(math.isnan(v) for v in timer.window())


def test_a_step_with_a_pause_is_left_out(monkeypatch):
    advance = _clock(monkeypatch)
    timer = StepTimer()
    timer.step_done()
    advance(0.1)
    timer.pause()  # save_state, main_process_first, a load
    advance(5.0)
    timer.work()
    timer.step_done()
    advance(0.2)
    timer.work()
    timer.step_done()
    assert [round(x, 6) for x in timer.own] == [0.2]


def test_on_a_gpu_the_own_part_is_the_gpus_time_between_cuda_events(monkeypatch):
    """Events recorded where the wall clock marks; read once the GPU has passed them (query), all at a window's
    end. Their times here: when the fake GPU reaches them, 2 s after the CPU queued them."""
    advance = _clock(monkeypatch)
    done = []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self, stream):
            assert stream == "stream-of-cuda:1"
            self.at = st.time.monotonic() + 2.0

        def query(self):
            return self in done

        def synchronize(self):
            done.append(self)

        def elapsed_time(self, other):
            assert self in done and other in done
            return (other.at - self.at) * 1000

    monkeypatch.setattr(st.torch.cuda, "Event", Event)
    monkeypatch.setattr(st.torch.cuda, "current_stream", lambda device: f"stream-of-{device}")
    timer = StepTimer(torch.device("cuda", 1))
    timer.step_done()
    advance(0.3)
    timer.work()
    advance(0.1)
    timer.step_done()
    assert timer.own == [] and len(timer._pending) == 1  # not reached yet
    done.extend([timer._pending[0][0], timer._pending[0][1]])
    advance(0.5)
    timer.work()
    timer.step_done()  # the first pair is read now; the second waits
    assert [round(x, 6) for x in timer.own] == [0.3] and len(timer._pending) == 1
    assert [round(x, 6) for x in timer.window()] == [0.4, 0.45]  # medians of (0.3, 0.5) and of (0.4, 0.5)
    assert timer._pending == collections.deque()


class _Group:
    """The ranks' rows for each window, as all_gather would return them; what each call sent."""

    def __init__(self, others):
        self.others, self.sent, self.hosts = others, [], ["node0", "node1", "node2"]

    def gather(self, row):
        self.sent.append(row)
        return [row, *[[own, 1.0, row[2], 0.0] for own in self.others]]


def _check(monkeypatch, tmp_path, rank=0, action="warn", others=(NAN,), window_s="0", env=None):
    monkeypatch.setenv("HPC_STRAGGLER_WINDOW_STEPS", "5")
    monkeypatch.setenv("HPC_STRAGGLER_WINDOW_S", window_s)
    monkeypatch.setenv("HPC_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("HPC_TASK", "0")
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    (tmp_path / "tasks").mkdir(exist_ok=True)
    process = SimpleNamespace(distributed=True, device=torch.device("cpu"), backend="gloo", rank=rank,
                              world_size=1 + len(others), is_main_process=rank == 0)
    monkeypatch.setattr(st.dist, "is_initialized", lambda: True)
    check = Stragglers(process, 1.5, action, 3)
    group = _Group(list(others))
    monkeypatch.setattr(check, "_gather", group.gather)
    monkeypatch.setattr(check, "hosts", lambda: group.hosts[:process.world_size])
    monkeypatch.setattr(st, "_notify", lambda text, key: None)
    return check, group


def _steps(check, advance, first, last, own=0.1, pause_at=()):
    """Optimizer steps first..last, each with `own` seconds before backward and 0.05 s after it."""
    stops = {}
    for step in range(first, last + 1):
        advance(own)
        if step in pause_at:
            check.pause()
        check.work()
        advance(0.05)
        why = check.step_done(step)
        if why:
            stops[step] = why
    return stops


def test_windows_end_at_multiples_of_the_window_after_a_resume_too(monkeypatch, tmp_path):
    advance = _clock(monkeypatch)
    check, group = _check(monkeypatch, tmp_path)
    _steps(check, advance, 1, 12)
    assert len(group.sent) == 2  # steps 5 and 10: the same steps on every rank
    check, group = _check(monkeypatch, tmp_path)  # a resumed attempt, from step 7's checkpoint
    _steps(check, advance, 8, 21)
    assert len(group.sent) == 3  # 10, 15, 20
    assert group.sent[0][0] == pytest.approx(0.1)  # step 9 and 10's own parts (8 only started the clock)
    _steps(check, advance, 4, 4)  # load_state moved the counters back: aligned again, nothing gathered
    assert len(group.sent) == 3
    _steps(check, advance, 5, 10)  # windows end at 5 and 10, on every rank
    assert len(group.sent) == 5


def test_short_windows_are_not_judged_and_the_next_is_made_long_enough(monkeypatch, tmp_path):
    advance = _clock(monkeypatch)
    check, group = _check(monkeypatch, tmp_path, others=(0.5,), window_s="2")
    _steps(check, advance, 1, 5)  # 4 steps of 0.15 s: 0.6 s, under 2 s
    assert (len(group.sent), check.window_steps) == (1, 21)  # 5 * 1.25 * 2 / 0.6
    assert not (tmp_path / "tasks" / "0.stragglers").exists()
    _steps(check, advance, 6, 5 + 21 * 2)
    assert len(group.sent) == 3 and (tmp_path / "tasks" / "0.stragglers").exists()


def test_a_paused_step_is_not_evidence(monkeypatch, tmp_path):
    advance = _clock(monkeypatch)
    check, group = _check(monkeypatch, tmp_path)
    _steps(check, advance, 1, 5, pause_at={3, 4, 5})
    assert group.sent[0][0] == pytest.approx(0.1)  # step 2 only
    _steps(check, advance, 6, 10, pause_at=set(range(6, 11)))
    assert math.isnan(group.sent[1][0]) and math.isnan(group.sent[1][1])  # nothing measured: sent as such


def test_rank_0_names_a_straggler_in_the_log_the_job_folder_and_the_trackers(monkeypatch, tmp_path, capsys):
    advance = _clock(monkeypatch)
    logged = []
    monkeypatch.setattr(trackers, "log_to_running", lambda values, step: logged.append((values, step)))
    check, _ = _check(monkeypatch, tmp_path, others=(0.1, 0.45))  # 3 ranks: rank 2 takes 4.5x
    assert _steps(check, advance, 1, 20) == {}  # warn: no stop
    err = capsys.readouterr().err
    assert err.count("hpc: straggler: rank 2 on node2 takes 4.5x the median rank's time per step (2 windows in a "
                     "row, at step 10)\n") == 1, err
    lines = (tmp_path / "tasks" / "0.stragglers").read_text().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert {k: entry[k] for k in ("rank", "host", "ratio", "step", "action")} == {
        "rank": 2, "host": "node2", "ratio": 4.5, "step": 10, "action": "warn"}
    assert logged == [({"hpc/straggler_ratio": pytest.approx(4.5), "hpc/straggler_rank": 2}, 10)]
    assert not (tmp_path / "tasks" / "0.excluded").exists()


def test_another_rank_decides_alike_and_writes_nothing(monkeypatch, tmp_path, capsys):
    advance = _clock(monkeypatch)
    check, group = _check(monkeypatch, tmp_path, rank=1, action="requeue", others=(0.1, 0.45),
                          env={"HPC_REQUEUE_FILE": str(tmp_path / "rq")})
    group.gather = lambda row: [[0.1, 1.0, row[2], 1.0], row, [0.45, 1.0, row[2], 0.0]]  # rank 0 may requeue
    monkeypatch.setattr(check, "_gather", group.gather)
    stops = _steps(check, advance, 1, 10)
    assert stops == {10: "straggler: rank 2 on node2 (4.5x the median step time)"}
    assert capsys.readouterr().err == "" and list((tmp_path / "tasks").iterdir()) == []


def test_requeue_excludes_the_node_and_stops_every_rank_alike(monkeypatch, tmp_path, capsys):
    advance = _clock(monkeypatch)
    check, group = _check(monkeypatch, tmp_path, action="requeue", others=(0.3,),
                          env={"HPC_REQUEUE_FILE": str(tmp_path / "rq")})
    stops = _steps(check, advance, 1, 15)
    assert stops == {10: "straggler: rank 1 on node1 (3.0x the median step time)"}
    assert group.sent[-1][3] == 1.0  # rank 0 said it may requeue: the others follow that
    assert (tmp_path / "tasks" / "0.excluded").read_text() == "node1 straggler (3.0x the median)\n"
    assert "checkpointing and requeueing without node1" in capsys.readouterr().err


def test_requeue_that_cannot_happen_only_warns(monkeypatch, tmp_path, capsys):
    advance = _clock(monkeypatch)
    monkeypatch.delenv("HPC_REQUEUE_FILE", raising=False)
    check, group = _check(monkeypatch, tmp_path, action="requeue", others=(0.3,))  # no job script around it
    assert _steps(check, advance, 1, 15) == {}
    assert group.sent[-1][3] == 0.0
    assert "not requeued" in capsys.readouterr().err
    assert not (tmp_path / "tasks" / "0.excluded").exists()
    (tmp_path / "tasks" / "0.requeued").write_text("3\n")  # max_requeues (3) reached
    check, _ = _check(monkeypatch, tmp_path, action="requeue", others=(0.3,), env={"HPC_REQUEUE_FILE": "rq"})
    assert _steps(check, advance, 1, 15) == {}


def test_off_outside_a_job_or_with_one_process(monkeypatch):
    monkeypatch.setattr(st.dist, "is_initialized", lambda: True)
    one = SimpleNamespace(distributed=False, device=torch.device("cpu"), backend=None, rank=0, world_size=1,
                          is_main_process=True)
    check = Stragglers(one, 1.5, "requeue", 3)
    assert not check.enabled and check.step_done(20) is None
    two = SimpleNamespace(**{**vars(one), "distributed": True, "world_size": 2})
    assert Stragglers(two, 1.5, "warn", 3).enabled and not Stragglers(two, 1.5, "warn", 3, enabled=False).enabled
    assert not Stragglers.off(two).enabled


def test_the_metric_reaches_every_started_tracker_of_the_process(tmp_path):
    run = trackers.Trackers()
    run.start(["jsonl"], True, "proj", None, None, tmp_path, tmp_path)
    trackers.log_to_running({"hpc/straggler_ratio": 2.5}, 40)
    run.finish()
    rows = [json.loads(line) for f in tmp_path.rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert any(r.get("hpc/straggler_ratio") == 2.5 and r.get("step") == 40 for r in rows), rows
    trackers.log_to_running({"hpc/straggler_ratio": 1.0}, 41)  # finished: nothing, no error


def test_status_reads_the_stragglers_of_every_task(tmp_path):
    (tmp_path / "tasks").mkdir()
    host = socket.gethostname()
    (tmp_path / "tasks" / "0.stragglers").write_text(
        json.dumps({"rank": 3, "host": "node2", "ratio": 2.13, "step": 120}) + "\n{damaged\n")
    (tmp_path / "tasks" / "1.stragglers").write_text(json.dumps({"rank": 1, "host": host, "ratio": 4, "step": 8}))
    found = base.stragglers(base.LocalFiles(tmp_path))
    assert [(s["task"], s["rank"], s["host"]) for s in found] == [("0", 3, "node2"), ("1", 1, host)]
    assert straggler_lines(found[:1], array=False) == [
        "  straggler: rank 3 on node2 (2.1x the median step time at step 120)"]
    assert straggler_lines(found, array=True)[1] == f"  straggler: rank 1 on {host} (4.0x the median step time " \
                                                     "at step 8) (task 1)"
    assert len(straggler_lines(found * 4, array=True, shown=5)) == 6
    assert base.stragglers(base.LocalFiles(tmp_path / "nothing")) == []
