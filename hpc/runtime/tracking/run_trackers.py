"""The trackers one run started (init_trackers, get_tracker, log, end_training): on the main process only."""

from __future__ import annotations

import weakref
from pathlib import Path

from hpc.errors import HpcError
from hpc.runtime.tracking import registry
from hpc.runtime.tracking import trackers as tracking

_running: weakref.WeakSet = weakref.WeakSet()  # the runs of this process that started trackers


def log_to_running(values: dict, step: int | None) -> None:
    """What hpc measures itself (a straggler's ratio) to every tracker this process's runs started: the run guard
    reports without holding the Accelerator."""
    for run in list(_running):
        run.log(values, step, None)


class NoTracker:
    """What get_tracker gives where no tracker runs: any call does nothing."""

    name = None

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class Trackers:
    def __init__(self):
        self.started: list = []
        self.resumed_step: int | None = None  # the step training resumed at, once it has

    # an Accelerator may be pickled: the copy starts no tracker of this process's
    def __getstate__(self) -> dict:
        return {**self.__dict__, "started": []}

    def __iter__(self):
        return iter(self.started)

    def start(self, log_with: list, main_process: bool, project_name: str, config: dict | None,
              init_kwargs: dict | None, jsonl_folder: Path, logging_dir: Path) -> None:
        """Every tracker of ``log_with`` (JSONL always); ``init_kwargs`` per tracker name go to its library."""
        chosen = registry.resolve(log_with)  # checked on every rank: a typo fails everywhere alike
        if not main_process:
            return
        _running.add(self)
        init_kwargs = dict(init_kwargs or {})
        unknown = sorted(set(init_kwargs) - {getattr(c, "name", None) for c in chosen})
        if unknown:
            raise HpcError(f"init_kwargs for {unknown[0]!r}, which is not in log_with", fix="add it to log_with")
        for item in chosen:
            folder = jsonl_folder if item is tracking.JsonlTracker else logging_dir
            if isinstance(item, tracking.GeneralTracker):  # the user's own, built by the user
                item.start()
                if config:
                    item.store_init_configuration(config)
                tracker = item
            else:
                tracker = item(folder, project_name, config, **init_kwargs.get(item.name, {}))
            if self.resumed_step is not None:  # trackers started after the resume continue the run too
                tracker.resumed_at(self.resumed_step)
            self.started.append(tracker)

    def get(self, name: str, unwrap: bool = False):
        for tracker in self.started:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        return NoTracker()

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        log_kwargs = log_kwargs or {}
        for tracker in self.started:
            tracker.log(values, step, **log_kwargs.get(tracker.name, {}))

    def resumed_at(self, step: int) -> None:
        self.resumed_step = step
        for tracker in self.started:
            tracker.resumed_at(step)

    def finish(self) -> None:
        for tracker in self.started:
            tracker.finish()
        self.started.clear()
