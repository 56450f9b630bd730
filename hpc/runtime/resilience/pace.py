"""How long steps and saves take, so the job can say when preemption.lead_time leaves no room to stop."""

from __future__ import annotations

import collections
import contextlib
import time

from hpc.contract import timings as lead_time
from hpc.runtime.resilience import preemption

_WINDOW = 50  # steps: the slowest of the recent ones is what a stop may have to wait for


class Pace:
    def __init__(self, lead_time_s: float | None, job_dir: str | None, main_process: bool):
        self.lead_time_s, self.job_dir, self.main_process = lead_time_s, job_dir, main_process
        self.step_times: collections.deque[float] = collections.deque(maxlen=_WINDOW)
        self.save_s: float | None = None
        self._last_step_end: float | None = None
        self._warned = False

    def step_done(self) -> None:
        now = time.monotonic()
        if self._last_step_end is not None:
            self.step_times.append(now - self._last_step_end)
        self._last_step_end = now

    @contextlib.contextmanager
    def saving(self):
        """Around a synchronous save: its time is the save's, not the step's."""
        start = time.monotonic()
        yield
        end = time.monotonic()
        self.save_s = end - start
        if self._last_step_end is not None:
            self._last_step_end += self.save_s
        self._report()

    def timings(self) -> lead_time.Timings | None:
        if self.save_s is None or not self.step_times:
            return None
        return lead_time.Timings(max(self.step_times), self.save_s)

    def _report(self) -> None:
        timings = self.timings()
        if timings is None or not self.main_process:
            return
        if self.job_dir:
            try:
                lead_time.write(self.job_dir, timings)
            except OSError:
                pass  # a measurement must never stop training
        problem = lead_time.shortfall(timings, self.lead_time_s) if self.lead_time_s is not None else None
        if problem and not self._warned:
            self._warned = True
            preemption.log(f"warning: {problem}")
