"""Rank 0's timeline of the attempt (hpc/contract/timeline.py), written as the run goes, for `hpc report`.

A handful of lines an attempt, plus a ``progress`` line at most every PROGRESS_EVERY_S: a step pays one
``time.monotonic()`` and a comparison, a save one short append. Off outside an hpc job. At the end of an attempt
(a stop, the end of training) the goodput so far goes to the trackers and the log.

The process's exit is an event too (``ended``): most scripts return without end_training(), and a run that ended
must not read as one killed after its last progress line. Rank 0 notes every exit; the first rank of each other
node notes an exit by an exception only (a lost node's survivors fail in their next collective and say which step
the run had reached, whichever node rank 0 was on).
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import weakref
from typing import Callable

from hpc.contract import goodput, layout, timeline

# the writers of this process's runs, newest last (weak: a dropped Accelerator goes), and the process they are of:
# one atexit hook, which a child forked from this process (os.fork, then a normal exit) must not run as its own
_at_exit: list[weakref.ref] = []
_at_exit_pid: list[int] = []


def _note_exit() -> None:
    if not _at_exit_pid or _at_exit_pid[0] != os.getpid():
        return
    for ref in reversed(_at_exit):
        writer = ref()
        if writer is not None:
            writer.ended()
            return


class TimelineWriter:
    """``main``: rank 0, which writes every event; ``node_first``: the first rank of a node, which notes only an
    exit by an exception; ``steps``: the optimizer steps completed so far, read at the exit; ``on_exit``: called
    on rank 0 once the exit is noted (the end-of-attempt goodput line of a script that just returns)."""

    def __init__(self, main: bool, every_s: float | None = None, *, node_first: bool = False,
                 steps: Callable[[], int] | None = None, on_exit: Callable[[], None] | None = None):
        job_dir = os.environ.get("HPC_JOB_DIR")
        self.task = os.environ.get("HPC_TASK", "0")
        self.main = bool(main and job_dir)
        self.file = layout.JobFolder(job_dir).task(self.task, layout.TaskFile.TIMELINE) \
            if ((main or node_first) and job_dir) else None
        self.job_dir = job_dir
        self.every_s = timeline.progress_every_s() if every_s is None else every_s
        self._steps = steps
        self._on_exit = on_exit
        self._next_progress = 0.0
        self._training = False
        self._signalled = False
        self._ended = False
        self._last_step_t: float | None = None
        # more fields for each progress line (the fast tier's saves since the last one: run_guard)
        self.progress_fields: Callable[..., dict] | None = None
        if self.file is not None and steps is not None:
            if not _at_exit_pid:
                atexit.register(_note_exit)
                _at_exit_pid.append(os.getpid())
            _at_exit.append(weakref.ref(self))

    @property
    def on(self) -> bool:
        return self.main

    def note(self, event: str, **fields) -> None:
        if self.main:
            timeline.append(self.file, event, **fields)

    def started(self, world: int, step: int, hosts: list[str] | None = None) -> None:
        """``hosts``: the run's node hosts (sorted), where known: a round that replaced a node says so."""
        if not self.main:
            return
        jobid = layout.JobFolder(self.job_dir).task(self.task, layout.TaskFile.JOBID)
        try:  # the batch script writes it first thing each attempt: its mtime is when the attempt began
            batch_start = round(os.stat(jobid).st_mtime, 3)
        except OSError:
            batch_start = None
        nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES")
        per_node = os.environ.get("LOCAL_WORLD_SIZE", "")
        run_nodes = -(-world // int(per_node)) if per_node.isdigit() and int(per_node) > 0 else None
        self.note("started", batch_start=batch_start, proc_start=_process_start(),
                  nodes=int(nodes) if nodes and nodes.isdigit() else None, run_nodes=run_nodes,
                  nodelist=os.environ.get("SLURM_JOB_NODELIST"), world=world, step=step,
                  **({"hosts": hosts} if hosts else {}))

    def training(self, step: int) -> None:
        """The loop's first work this attempt (after any resume): training time starts here."""
        if self._training or not self.main:
            return
        self._training = True
        self.note("training", step=step)

    def step_done(self, step: int) -> None:
        if self.file is None:
            return
        self._last_step_t = time.time()  # for the exit's line: where the run's training ended
        if not self.main:
            return
        now = time.monotonic()
        if now >= self._next_progress:
            self._next_progress = now + self.every_s
            self.note("progress", step=step, **(self.progress_fields() if self.progress_fields else {}))

    def _last_progress(self, step: int | None) -> None:
        """The run is ending: what the progress fields gathered since the last progress line (the fast tier's saves
        of the last seconds) gets a line of its own, or the report would never count it."""
        if self.main and self.progress_fields is not None:
            fields = self.progress_fields(final=True)
            if fields:
                self.note("progress", step=step, **fields)

    def signal(self, why: str) -> None:
        if not self._signalled:
            self._signalled = True
            self.note("signal", why=why)

    def ended(self) -> None:
        """The process is exiting (atexit): how, and the step it had reached. An uncaught exception is known by
        then (Python sets sys.last_value before the excepthook runs); a kill by a signal runs no atexit at all."""
        if self._ended or self.file is None or self._steps is None:
            return
        self._ended = True
        error = getattr(sys, "last_value", None)
        if error is None and not self.main:
            return
        fields = {"how": "exception", "error": type(error).__name__} if error is not None else {"how": "exit"}
        try:
            step = int(self._steps())
        except Exception:  # noqa: BLE001 - a half-torn-down process still notes that it ended
            step = None
        try:
            self._last_progress(step)
        except Exception:  # noqa: BLE001 - the ended line matters more
            pass
        timeline.append(self.file, "ended", step=step, last_step_t=self._last_step_rounded(),
                        rank=os.environ.get("RANK"), **fields)
        if self.main and self._on_exit is not None:
            self._on_exit()

    def finished(self, step: int) -> None:
        """end_training(): the work is done (its last optimizer step: where training ended)."""
        self._last_progress(step)
        self.note("finished", step=step, last_step_t=self._last_step_rounded())

    def _last_step_rounded(self) -> float | None:
        return round(self._last_step_t, 3) if self._last_step_t is not None else None

    def summary(self) -> dict | None:
        """The goodput of the attempts so far, as the job sees them (its own events; the allocation's end: now)."""
        if not self.main:
            return None
        events = timeline.read(self.job_dir, self.task)
        if not events:
            return None
        attempts = goodput.build(events, now=time.time())
        return {**goodput.totals(attempts), "attempt_redone_steps": attempts[-1].redone_steps if attempts else 0}


def _process_start() -> float | None:
    """When this process started (its imports count as start-up, before any line of the timeline)."""
    try:
        import psutil

        return round(psutil.Process().create_time(), 3)
    except Exception:  # noqa: BLE001 - only a detail of the report
        return None
