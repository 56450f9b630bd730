from __future__ import annotations

from typing import Protocol

from hpc.jobs import JobRecord
from hpc.slurm.commands import TaskState


class Executor(Protocol):
    """Submit a materialized job folder, report its tasks' states, cancel it."""

    def submit(self, job_dir: str, script: str, workdir: str, time_limit: str) -> tuple[str, dict]:
        """Start the job; returns (job id, executor details for the record)."""

    def states(self, record: JobRecord) -> dict[str, TaskState]:
        """Task id -> state. A task whose end is unknown is UNKNOWN, never assumed COMPLETED."""

    def cancel(self, record: JobRecord, task: str | None = None) -> None: ...


def from_exit_file(record: JobRecord, task: str) -> TaskState | None:
    """What the job wrote about its own end (tasks/<task>.exit)."""
    path = record.dir / "tasks" / f"{task}.exit"
    try:
        code = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return TaskState("COMPLETED" if code == 0 else "FAILED", code)
