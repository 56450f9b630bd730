"""Where checkpoints live: `<root>/step-<N>/`, committed by their manifest; newest first; keep the last K."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hpc.runtime.checkpoint import manifest
from hpc.runtime.settings import MIN_KEEP

_STEP = re.compile(r"^step-(\d+)$")
_PURGED = ".purged-"  # a doomed folder, uncommitted and renamed: no longer a step, deleted on a thread


@dataclass(frozen=True)
class Entry:
    step: int
    path: Path
    manifest: dict | None

    @property
    def committed(self) -> bool:
        return self.manifest is not None


class CheckpointStore:
    def __init__(self, root: Path, keep: int = MIN_KEEP):
        self.root = Path(root)
        self.keep = max(MIN_KEEP, int(keep))

    def step_dir(self, step: int) -> Path:
        return self.root / f"step-{step}"

    def entries(self) -> list[Entry]:
        """Every step folder, newest first."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            m = _STEP.match(path.name)
            if m and path.is_dir():
                found.append(Entry(int(m.group(1)), path, manifest.read(path)))
        return sorted(found, key=lambda e: e.step, reverse=True)

    def committed(self) -> list[Entry]:
        return [e for e in self.entries() if e.committed]

    def newest_good(self, skipped=None) -> Entry | None:
        """The newest committed checkpoint whose manifest is well formed and whose every file matches it, read
        by this process alone; ``skipped(entry, problem)`` hears of each one passed over."""
        for entry in self.committed():
            problem = manifest.check(entry.path, entry.manifest)
            if problem is None:
                return entry
            if skipped is not None:
                skipped(entry, problem)
        return None

    def purge(self, background: bool = False, damaged: frozenset[Path] = frozenset()) -> list[Path]:
        """Drop committed checkpoints beyond the newest `keep`, and folders a cut-short save left behind
        below the newest commit. ``damaged``: committed folders found damaged, which do not count among the
        kept and go with the cut-short ones. Call only after a commit. With `background`, the folders are
        uncommitted and moved aside at once and deleted on a thread (deleting a GiB takes a third of a
        second)."""
        entries = self.entries()
        committed = [e for e in entries if e.committed and e.path not in damaged]
        if not committed:
            return []
        newest = committed[0].step
        doomed = [e.path for e in committed[self.keep:]]
        doomed += [e.path for e in entries if (not e.committed or e.path in damaged) and e.step < newest]
        trash = [p for p in self.root.iterdir() if p.name.startswith(_PURGED)]  # left by a purge cut short
        for path in doomed:
            # uncommit first: a purge cut short must not leave a folder that looks whole but is not
            (path / manifest.NAME).unlink(missing_ok=True)
            aside = path.with_name(f"{_PURGED}{path.name}-{os.getpid()}-{time.monotonic_ns()}")
            try:
                path.rename(aside)
            except OSError:
                aside = path
            trash.append(aside)
        if background:
            # not a daemon: a job that ends right after its last save still finishes the deleting
            threading.Thread(target=_remove, args=(trash,), name="hpc-purge").start()
        else:
            _remove(trash)
        return doomed


def _remove(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
