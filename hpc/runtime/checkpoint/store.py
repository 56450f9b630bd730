"""Where checkpoints live: `<root>/step-<N>/`, committed by their manifest; newest first; keep the last K."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from hpc.runtime.checkpoint import manifest

_STEP = re.compile(r"^step-(\d+)$")
MIN_KEEP = 2  # the newest may turn out damaged: there must always be one before it


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

    def purge(self) -> list[Path]:
        """Drop committed checkpoints beyond the newest `keep`, and folders a cut-short save left behind
        below the newest commit. Call only after a commit."""
        entries = self.entries()
        committed = [e for e in entries if e.committed]
        if not committed:
            return []
        newest = committed[0].step
        doomed = [e.path for e in committed[self.keep:]]
        doomed += [e.path for e in entries if not e.committed and e.step < newest]
        for path in doomed:
            # uncommit first: a purge cut short must not leave a folder that looks whole but is not
            (path / manifest.NAME).unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)
        return doomed
