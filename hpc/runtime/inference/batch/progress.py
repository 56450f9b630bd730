"""A batch-inference task's progress in the job folder, for `hpc status` (names: hpc.contract.batch_outputs).

Rank 0 writes what was done when the attempt started; each rank then counts only its own commits, in a file of
its own: no rank lists the output folder (a metadata storm on a parallel filesystem) to report progress.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hpc.contract import batch_outputs as names
from hpc.contract import layout
from hpc.contract.atomic import atomic_write

_EVERY_S = 2.0  # a rank's count is rewritten at most this often (and once more at its end)


class Progress:
    def __init__(self, attempt: str, rank: int):
        job_dir = os.environ.get("HPC_JOB_DIR")
        task = os.environ.get("HPC_TASK", "0")
        self.folder = layout.JobFolder(job_dir) if job_dir else None
        self.task, self.attempt, self.rank = task, attempt, rank
        self.committed = 0
        self._written_at = 0.0

    def _write(self, kind: str, text: str) -> None:
        if self.folder is None:
            return
        try:
            atomic_write(Path(self.folder.task(self.task, kind)), text)
        except OSError:
            pass  # progress is for people to read: a full disk must not stop the outputs

    def start(self, done: int, total: int) -> None:
        """Rank 0, before any rank commits in this attempt."""
        self._write(layout.TaskFile.ITEMS, json.dumps({"attempt": self.attempt, "done": done, "total": total}))

    def add(self, items: int, final: bool = False) -> None:
        self.committed += items
        now = time.monotonic()
        if final or now - self._written_at >= _EVERY_S:
            self._written_at = now
            self._write(names.rank_progress_kind(self.rank), f"{self.attempt} {self.committed}\n")
