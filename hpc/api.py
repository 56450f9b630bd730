"""`hpc.submit(...)`: the Python face of `hpc submit`, for scripts and for plain Python functions."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable

from hpc.cluster.config import precedence
from hpc.cluster.config.precedence import Effective


class Job:
    """A submitted script job: what `hpc status/wait/logs/cancel` do, as methods."""

    def __init__(self, record):
        self.record = record

    @property
    def id(self) -> str:
        return self.record.job_id

    @property
    def job_dir(self) -> Path:
        return self.record.dir

    def states(self) -> dict:
        from hpc.cluster import status

        return status.states(self.record)

    def state(self) -> str:
        from hpc.cluster import status

        return status.summarize(self.states())[0]

    def wait(self, timeout: float | None = None) -> int:
        """Block until the job ends; returns its exit code (0 when every task completed). A controller that does
        not answer for a while is asked again (said once on stderr); ``timeout`` bounds the whole wait
        (TimeoutError)."""
        from hpc.cluster import status

        return status.exit_code(status.wait(self.record, timeout))

    def logs(self, rank: int | None = 0, task: str | None = None) -> str:
        """One rank's log (rank=None: every log of the task) as text."""
        from hpc.cluster import status

        names = status.log_files(self.record, task or self.record.tasks[0], "rank" if rank is not None else "all", rank)
        return status.read_logs(self.record, names)

    def cancel(self) -> None:
        from hpc.cluster import backends

        backends.for_record(self.record).cancel(self.record)

    def __repr__(self) -> str:
        return f"Job({self.id!r}, {self.record.profile!r}, {str(self.job_dir)!r})"


class FunctionJob(Job):
    """A submitted Python function: a Job whose ranks each return a value."""

    def result(self, timeout: float | None = None) -> Any:
        """Rank 0's return value (waits for the job); raises hpc.cluster.functions.FunctionFailed if it raised."""
        from hpc.cluster import functions

        self.wait(timeout)
        return functions.read_result(self._files(), 0, key=self.record.result_key)

    def results(self, timeout: float | None = None) -> list:
        """Every rank's return value, by rank."""
        from hpc.cluster import functions

        self.wait(timeout)
        files = self._files()
        return [functions.read_result(files, r, key=self.record.result_key) for r in functions.result_ranks(files)]

    def _files(self):
        from hpc.cluster import backends

        return backends.for_record(self.record).files(self.record)


def _effective(profile: str | None, keys: dict) -> Effective:
    layers = [precedence.env_layer(), precedence.api_layer(keys)]
    return precedence.resolve(profile, layers)


def submit(target: str | Callable, *args: Any, profile: str | None = None, snapshot: bool = True,
           wait: bool = False, **keys: Any) -> Job:
    """Submit a script (``"train.py"``), a command, or a Python function.

    ``keys`` are job keys as in a job file (nodes=2, nproc_per_node=2, time="00:30:00", ...).
    A function runs once per process with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, as a
    script would; ``args`` are its arguments. Its job is like any other: `hpc list`, `hpc logs`, `hpc cancel`.
    """
    from hpc.cluster.submission import submit as submit_job

    argv = [sys.argv[0], "hpc.submit()"]
    if callable(target):
        from hpc.cluster import functions

        name = re.sub(r"[^A-Za-z0-9._+-]", "-", getattr(target, "__name__", "function")).strip("-._+") or "function"
        effective = _effective(profile, {"job_name": name, **keys, "module": functions.MODULE})
        if effective.job.array or effective.job.sweep:
            from hpc.errors import HpcError

            raise HpcError("a function job cannot be an array or a sweep (every task would share its result files)",
                           fix="submit one job per set of arguments, or a script")
        record = submit_job(effective, argv=argv, take_snapshot=snapshot, kind="function",
                            extra_files={functions.CALL_FILE: functions.pickle_call(target, args, {})})
        job = FunctionJob(record)
    else:
        target = str(target)
        kind = "script" if target.endswith(".py") else "command"
        keys = {**keys, kind: target if kind == "script" else [target]}
        if args:
            keys["args"] = [str(a) for a in args]
        job = Job(submit_job(_effective(profile, keys), argv=argv, take_snapshot=snapshot, kind=kind))
    if wait:
        job.wait()
    return job
