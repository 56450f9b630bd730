"""The files one rank writes into a checkpoint, with their sizes and checksums."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hpc.runtime.checkpoint import manifest
from hpc.runtime.checkpoint.hashing import HashingWriter

SUMS_PREFIX = ".sums-rank"


class FileSet:
    def __init__(self, folder: Path, rank: int, fsync: bool = False):
        self.folder, self.rank, self.fsync = Path(folder), rank, fsync
        self.sums: dict[str, dict] = {}
        self._claims: list[str] = []

    def save(self, name: str, obj) -> None:
        """torch.save through a checksumming writer."""
        import torch

        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with HashingWriter(path, fsync=self.fsync) as f:
            torch.save(obj, f)
            self.sums[name] = f.close()

    def claim(self, pattern: str) -> None:
        """Files a library writes for this rank (glob under the folder): hashed by this rank once written."""
        self._claims.append(pattern)

    def finish(self) -> Path:
        """Hash the claimed files and publish this rank's sums for the committing rank."""
        for pattern in self._claims:
            for path in sorted(self.folder.glob(pattern)):
                name = path.relative_to(self.folder).as_posix()
                if path.is_file() and name not in self.sums:
                    self.sums[name] = manifest.file_entry(path)
        out = self.folder / f"{SUMS_PREFIX}{self.rank}.json"
        manifest.write_json_atomic(out, self.sums, fsync=self.fsync)
        return out


def collect(folder: Path, world: int) -> dict[str, dict] | None:
    """Every rank's sums merged, plus the files no rank claimed (hashed here); None until all ranks published."""
    names = [folder / f"{SUMS_PREFIX}{r}.json" for r in range(world)]
    if not all(p.exists() for p in names):
        return None
    files: dict[str, dict] = {}
    for p in names:
        with open(p) as f:
            files.update(json.load(f))
    for root, _, filenames in os.walk(folder):
        for filename in filenames:
            path = Path(root) / filename
            name = path.relative_to(folder).as_posix()
            if name in files or filename.startswith(SUMS_PREFIX) or ".tmp" in filename or name == manifest.NAME:
                continue
            files[name] = manifest.file_entry(path)
    return files


def clear_sums(folder: Path, world: int) -> None:
    for r in range(world):
        (folder / f"{SUMS_PREFIX}{r}.json").unlink(missing_ok=True)
