"""Stragglers: a rank (and its node) persistently slower than the others is named in the log, the job folder
(`hpc status`) and the trackers; with straggler_action "requeue" the job checkpoints and runs again without it.

What is timed. In data-parallel training every rank's steps take equally long: the gradients' all-reduce makes
the fast ranks wait for the slowest. The wall time between two optimizer steps is the same on every rank, and says
nothing of which one is slow. What does is each rank's own part of a step, before it first waits for the others:
from the end of an optimizer step to the start of the next step's last backward() (where DDP's all-reduce
waits), or to its first collective (gather, reduce, ...) if that comes first; with gradient accumulation the
window's earlier micro-steps are in it. The run guard marks those points (work, collective, step_done). On a GPU
that part is timed with CUDA events on the current stream (the GPU's own time: its kernels, and its idling while
the CPU loads data), elsewhere with the wall clock. A step during which the run paused (a checkpoint save or load,
main_process_first, ...) is left out. Where no such point comes (a loop that calls loss.backward() itself and
makes no collective) the whole step is timed: equal on every rank, nothing is named. Under FSDP and ZeRO-3 the
forward's all-gathers wait for the others too: there a straggler's ratio comes out smaller than it is.

Windows. Every WINDOW_STEPS optimizer steps, counted from a multiple of that number (every rank ends a window at
the same optimizer step: the counters are the same on every rank, after a resume too, and an optimizer step is an
accumulation window), each rank sends the median of its window's times in one all_gather of four numbers (own
time, whole step, the window's length, whether rank 0 may requeue). A window shorter than WINDOW_MIN_S is not
judged, and the next one is made long enough from the gathered lengths, the same on every rank. A rank whose time
is at least ``threshold`` times the median rank's (the lower median: with 2 ranks, the faster one's), and at least
MIN_EXCESS_S and MIN_COST of a step more, in CONSECUTIVE_WINDOWS judged windows in a row, is a straggler. Every
rank holds the same gathered numbers, so every rank takes the same decision without another collective; the
hosts are gathered once, when a straggler is first named. Each rank is named once per attempt.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hpc.contract import layout
from hpc.contract.atomic import append_whole
from hpc.runtime.resilience import preemption
from hpc.runtime.tracking import run_trackers as trackers

WINDOW_STEPS = 20  # optimizer steps a window has at least; HPC_STRAGGLER_WINDOW_STEPS overrides (tests)
WINDOW_MIN_S = 5.0  # a window shorter than this is not judged; HPC_STRAGGLER_WINDOW_S overrides (tests: 0)
MAX_WINDOW_STEPS = 10_000
CONSECUTIVE_WINDOWS = 2
MIN_EXCESS_S = 0.01  # a rank slower by less per step is not worth naming, whatever the ratio
MIN_COST = 0.05  # ... nor by less than this share of the median step (what every rank waits for it)
METRIC = "hpc/straggler_ratio"


def reference(values: list[float]) -> float:
    """The median rank's value: the middle one, or the lower of the two middle ones (with 2 ranks, the smaller)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def _known(value: float) -> bool:
    return math.isfinite(value)


@dataclass(frozen=True)
class Straggler:
    rank: int
    ratio: float  # its own step time over the median rank's
    step: int  # the optimizer step that ended the window that named it


class Detector:
    """The rule, on every rank alike: each judged window's times of all ranks in, the stragglers named out."""

    def __init__(self, threshold: float, windows: int = CONSECUTIVE_WINDOWS):
        self.threshold, self.windows = threshold, windows
        self.streaks: dict[int, int] = {}  # rank -> judged windows in a row it was slow in
        self.named: set[int] = set()  # once per attempt

    def slow(self, own: list[float], steps: list[float]) -> dict[int, float]:
        """The ranks slow in one window, with their ratio to the median rank (NaN: a rank measured nothing)."""
        known = [v for v in own if _known(v)]
        if len(known) < 2:
            return {}
        ref = max(reference(known), 1e-6)
        step_s = reference([s for s in steps if _known(s)] or [0.0])
        floor = max(MIN_EXCESS_S, MIN_COST * step_s)
        return {rank: v / ref for rank, v in enumerate(own)
                if _known(v) and v >= self.threshold * ref and v - ref >= floor}

    def window(self, own: list[float], steps: list[float], step: int) -> list[Straggler]:
        """One judged window; the stragglers it names (a rank that measured nothing keeps its streak)."""
        slow = self.slow(own, steps)
        named = []
        for rank, value in enumerate(own):
            if not _known(value):
                continue
            self.streaks[rank] = self.streaks.get(rank, 0) + 1 if rank in slow else 0
            if self.streaks[rank] >= self.windows and rank not in self.named:
                self.named.add(rank)
                named.append(Straggler(rank, slow[rank], step))
        return named


class StepTimer:
    """This rank's own part of each optimizer step (see the module's docstring), and the whole step's wall time."""

    def __init__(self, cuda_device: torch.device | None = None):
        self.device = cuda_device
        self.own: list[float] = []
        self.steps: list[float] = []
        self._pending: collections.deque = collections.deque()  # GPU: (start, cut) events not yet read
        self._start = self._cut = self._collective = None  # (wall time, event or None)
        self._paused = False

    def _mark(self) -> tuple[float, object]:
        if self.device is None:
            return time.monotonic(), None
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return time.monotonic(), event

    def restart(self) -> None:
        """From now on: a step starts here (a window's collective, a realignment are not in it)."""
        self._start, self._cut, self._collective, self._paused = self._mark(), None, None, False

    def work(self) -> None:
        """backward(), accumulate(), a loader's pass: the last before the first collective ends the own part."""
        if self._start is not None and self._collective is None:
            self._cut = self._mark()

    def collective(self) -> None:
        if self._start is not None and self._collective is None:
            self._collective = self._mark()

    def pause(self) -> None:
        """A wait whose length is not the rank's own (a save, a load, main_process_first): the step is left out."""
        self._paused = True

    def step_done(self) -> None:
        end = self._mark()
        if self._start is not None and not self._paused:
            marks = [m for m in (self._cut, self._collective) if m is not None]
            cut = min(marks, key=lambda m: m[0]) if marks else end
            self.steps.append(end[0] - self._start[0])
            if self.device is None:
                self.own.append(cut[0] - self._start[0])
            else:
                self._pending.append((self._start[1], cut[1]))
        self._start, self._cut, self._collective, self._paused = end, None, None, False
        self._read_events(wait=False)

    def _read_events(self, wait: bool) -> None:
        while self._pending:
            start, cut = self._pending[0]
            if not (wait or cut.query()):
                return  # still queued on the GPU: read at a later step
            start.synchronize()
            cut.synchronize()
            self.own.append(start.elapsed_time(cut) / 1000.0)
            self._pending.popleft()

    def window(self) -> tuple[float, float]:
        """This window's medians (own part, whole step; NaN where no step was measured); the next starts empty."""
        self._read_events(wait=True)
        own = statistics.median(self.own) if self.own else math.nan
        steps = statistics.median(self.steps) if self.steps else math.nan
        self.own.clear()
        self.steps.clear()
        return own, steps


class Stragglers:
    """The run guard's straggler check: ``work``, ``collective`` and ``pause`` mark a step's points,
    ``step_done`` ends it (and, at a window's end, runs the one collective)."""

    def __init__(self, process, threshold: float, action: str, max_requeues: int, enabled: bool = True):
        self.process, self.action, self.max_requeues = process, action, max_requeues
        self.enabled = bool(enabled and process.distributed and dist.is_available() and dist.is_initialized())
        self.window_steps = max(1, int(os.environ.get("HPC_STRAGGLER_WINDOW_STEPS") or WINDOW_STEPS))
        self.min_window_s = float(os.environ.get("HPC_STRAGGLER_WINDOW_S") or WINDOW_MIN_S)
        cuda = process.device if self.enabled and process.device.type == "cuda" else None
        self.timer = StepTimer(cuda)
        self.detector = Detector(threshold)
        self._end: int | None = None  # the optimizer step that ends the window
        self._last = 0
        self._window_start = 0.0
        self._hosts: list[str] | None = None
        self._held = 0

    @classmethod
    def off(cls, process) -> Stragglers:
        return cls(process, math.inf, "warn", 0, enabled=False)

    def work(self) -> None:
        if self.enabled:
            self.timer.work()

    def collective(self) -> None:
        if self.enabled:
            self.timer.collective()

    def pause(self) -> None:
        if self.enabled:
            self.timer.pause()

    @contextlib.contextmanager
    def held_back(self):
        """No window's collective inside join_uneven_inputs (a joined rank takes no steps); the windows start over
        after the block, from the step counts every rank takes from the last to join (join_vote.py)."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            self._end = None

    def step_done(self, steps: int) -> str | None:
        """Optimizer step ``steps`` has ended; returns why the run must stop and requeue (straggler_action
        "requeue", a straggler named), the same on every rank, else None."""
        if not self.enabled or self._held:
            return None
        if self._end is None or not self._last < steps <= self._end:
            self._align(steps)  # the first step of the attempt, or the counters moved (load_state)
            return None
        self._last = steps
        self.timer.step_done()
        if steps < self._end:
            return None
        why = self._window_end(steps)
        self.timer.restart()
        self._window_start = time.monotonic()
        return why

    def _align(self, steps: int) -> None:
        self._last = steps
        self._end = (steps // self.window_steps + 1) * self.window_steps
        self.timer.own.clear()
        self.timer.steps.clear()
        self.timer.restart()
        self._window_start = time.monotonic()

    def _window_end(self, steps: int) -> str | None:
        own, step_s = self.timer.window()
        length = time.monotonic() - self._window_start
        may_requeue = self.process.is_main_process and self.action == "requeue" and _can_requeue(self.max_requeues)
        rows = self._gather([own, step_s, length, float(may_requeue)])
        lengths = [row[2] for row in rows]
        judged = reference(lengths) >= self.min_window_s or self.window_steps >= MAX_WINDOW_STEPS
        named = self.detector.window([r[0] for r in rows], [r[1] for r in rows], steps) if judged else []
        self._size(reference(lengths))
        self._end = steps + self.window_steps
        if not named:
            return None
        return self._name(named, may_requeue=bool(rows[0][3]))

    def _size(self, length: float) -> None:
        """The next window, long enough to be judged (from gathered numbers: the same on every rank)."""
        if length < self.min_window_s and self.window_steps < MAX_WINDOW_STEPS:
            wanted = math.ceil(self.window_steps * 1.25 * self.min_window_s / max(length, 1e-3))
            self.window_steps = min(MAX_WINDOW_STEPS, max(2 * self.window_steps, wanted))

    def _gather(self, row: list[float]) -> list[list[float]]:
        """Every rank's row, in rank order: the check's one collective per window."""
        device = self.process.device if self.process.backend == "nccl" else "cpu"
        mine = torch.tensor(row, dtype=torch.float64, device=device)
        rows = [torch.empty_like(mine) for _ in range(self.process.world_size)]
        dist.all_gather(rows, mine)
        return [r.tolist() for r in rows]

    def hosts(self) -> list[str]:
        """Every rank's host, gathered once, when a straggler is first named (every rank names it alike)."""
        if self._hosts is None:
            names: list = [None] * self.process.world_size
            dist.all_gather_object(names, socket.gethostname())
            self._hosts = [str(n) for n in names]
        return self._hosts

    def _name(self, named: list[Straggler], may_requeue: bool) -> str | None:
        hosts = self.hosts()
        requeue = self.action == "requeue" and may_requeue
        if self.process.is_main_process:
            for straggler in named:
                report(straggler, hosts[straggler.rank], self.action, requeue)
            if self.action == "requeue" and not requeue:
                preemption.log("straggler_action requeue: not requeued (no job script to requeue it without the "
                               f"node, or max_requeues={self.max_requeues} reached): carrying on")
            if requeue:
                exclude(sorted({hosts[s.rank]: s.ratio for s in named}.items()))
        if not requeue:
            return None
        return "; ".join(f"straggler: rank {s.rank} on {hosts[s.rank]} ({s.ratio:.1f}x the median step time)"
                         for s in named)


def _can_requeue(max_requeues: int) -> bool:
    """Whether the job script can run the task again, without the straggler's node (rank 0 asks)."""
    return bool(os.environ.get("HPC_JOB_DIR")) and preemption.job_script_requeues() and (
        preemption.hpc_requeue_count() < max_requeues)


def _append(path: str | None, line: str) -> None:
    if path is None:
        return
    try:
        append_whole(path, line + "\n")
    except OSError as e:
        print(f"hpc: could not note the straggler in {path}: {e}", file=sys.stderr, flush=True)


def report(straggler: Straggler, host: str, action: str, requeue: bool) -> None:
    """Rank 0: the log line, tasks/<task>.stragglers, the trackers' metric and a notice."""
    s = straggler
    what = (f"rank {s.rank} on {host} takes {s.ratio:.1f}x the median rank's time per step "
            f"({CONSECUTIVE_WINDOWS} windows in a row, at step {s.step})")
    then = f"; checkpointing and requeueing without {host}" if requeue else ""
    preemption.log(f"straggler: {what}{then}")
    _append(layout.this_task_file(layout.TaskFile.STRAGGLERS), json.dumps(
        {"rank": s.rank, "host": host, "ratio": round(s.ratio, 3), "step": s.step, "action": action,
         "requeued": requeue, "attempt": preemption.requeue_count(), "time": round(time.time(), 3)}))
    try:
        trackers.log_to_running({METRIC: s.ratio, "hpc/straggler_rank": s.rank}, s.step)
    except Exception as e:  # a tracker's failure must never stop training
        preemption.log(f"straggler: not logged to the trackers: {type(e).__name__}: {e}")
    # a notice may take seconds (a webhook): not in the training loop's time
    threading.Thread(target=_notify, args=(what + then, f"straggler-{host}"), name="hpc-straggler-notice").start()


def _notify(text: str, key: str) -> None:
    try:
        from hpc.runtime.resilience import notify

        notify.send("straggler", text, key=key)
    except Exception:  # a notice is a courtesy
        pass


def exclude(hosts: list[tuple[str, float]]) -> None:
    """tasks/<task>.excluded: the nodes the requeued job must not run on, "<node> <why>" a line each."""
    for host, ratio in hosts:
        _append(layout.this_task_file(layout.TaskFile.EXCLUDED), f"{host} straggler ({ratio:.1f}x the median)")
