"""Rank 0's timeline of the attempt (hpc/contract/timeline.py), written as the run goes, for `hpc report`.

A handful of lines an attempt, plus a ``progress`` line at most every PROGRESS_EVERY_S: a step pays one
``time.monotonic()`` and a comparison, a save one short append. Off on other ranks and outside an hpc job. At
the end of an attempt (a stop, the end of training) the goodput so far goes to the trackers and the log.
"""

from __future__ import annotations

import os
import time

from hpc.contract import goodput, layout, timeline


class TimelineWriter:
    def __init__(self, enabled: bool, every_s: float | None = None):
        job_dir = os.environ.get("HPC_JOB_DIR")
        self.task = os.environ.get("HPC_TASK", "0")
        self.file = layout.JobFolder(job_dir).task(self.task, layout.TaskFile.TIMELINE) if (enabled and job_dir) \
            else None
        self.job_dir = job_dir
        self.every_s = timeline.progress_every_s() if every_s is None else every_s
        self._next_progress = 0.0
        self._training = False
        self._signalled = False

    @property
    def on(self) -> bool:
        return self.file is not None

    def note(self, event: str, **fields) -> None:
        if self.file is not None:
            timeline.append(self.file, event, **fields)

    def started(self, world: int, step: int) -> None:
        if self.file is None:
            return
        jobid = layout.JobFolder(self.job_dir).task(self.task, layout.TaskFile.JOBID)
        try:  # the batch script writes it first thing each attempt: its mtime is when the attempt began
            batch_start = round(os.stat(jobid).st_mtime, 3)
        except OSError:
            batch_start = None
        nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES")
        self.note("started", batch_start=batch_start, nodes=int(nodes) if nodes and nodes.isdigit() else None,
                  nodelist=os.environ.get("SLURM_JOB_NODELIST"), world=world, step=step)

    def training(self, step: int) -> None:
        """The loop's first work this attempt (after any resume): training time starts here."""
        if self._training or self.file is None:
            return
        self._training = True
        self.note("training", step=step)

    def step_done(self, step: int) -> None:
        if self.file is None:
            return
        now = time.monotonic()
        if now >= self._next_progress:
            self._next_progress = now + self.every_s
            self.note("progress", step=step)

    def signal(self, why: str) -> None:
        if not self._signalled:
            self._signalled = True
            self.note("signal", why=why)

    def summary(self) -> dict | None:
        """The goodput of the attempts so far, as the job sees them (its own events; the allocation's end: now)."""
        if self.file is None:
            return None
        events = timeline.read(self.job_dir, self.task)
        if not events:
            return None
        attempts = goodput.build(events, now=time.time())
        return {**goodput.totals(attempts), "attempt_redone_steps": attempts[-1].redone_steps if attempts else 0}
