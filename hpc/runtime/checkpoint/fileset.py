"""The files one rank writes into a checkpoint, with their sizes and checksums."""

from __future__ import annotations

import json
import os
import re
import time
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

    def hash_claimed(self) -> None:
        """The claimed files' sizes and checksums, in ``sums``."""
        for pattern in self._claims:
            for path in sorted(self.folder.glob(pattern)):
                name = path.relative_to(self.folder).as_posix()
                if path.is_file() and name not in self.sums:
                    self.sums[name] = manifest.file_entry(path)

    def finish(self) -> Path:
        """Hash the claimed files and publish this rank's sums for the committing rank."""
        self.hash_claimed()
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


# --- replicated checkpoints, saved by each rank alone ---------------------------------------------------
# Rank 0's files (the shared state and its own RNG) are listed in the manifest. Every other rank's files (its RNG,
# its stream readers) are its "part": listed, with the point of training they belong to, in `.rank<r>.json`,
# written last by an atomic rename. A part whose point differs from the manifest's belongs to another save.
_PART = re.compile(r"^\.rank(\d+)\.json$")
_RANK_FILE = re.compile(r"^(?:rng|loaders)/rank(\d+)\.pt$")


def point(record: dict) -> tuple[int, int]:
    """The point of training a record (the save's meta, a manifest, a part) belongs to: (step, micro_step).
    A record read from disk with other values there is of no point of training: (-1, -1) matches none."""
    at = record.get("step", 0), record.get("micro_step", 0)
    return at if all(isinstance(v, int) and not isinstance(v, bool) for v in at) else (-1, -1)


def part_name(rank: int) -> str:
    return f".rank{rank}.json"


def publish_part(folder: Path, rank: int, sums: dict[str, dict], at: tuple[int, int], fsync: bool = False) -> None:
    manifest.write_json_atomic(folder / part_name(rank), {"files": sums, "step": at[0], "micro_step": at[1]},
                               fsync=fsync)


def read_part(folder: Path, rank: int) -> dict | None:
    try:
        with open(folder / part_name(rank)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    # a part's file names are moved and read: one naming a path outside the folder is no part
    return data if isinstance(data, dict) and manifest.files_problem(data.get("files")) is None else None


def _of_another_rank(name: str) -> bool:
    m = _PART.match(name) or _RANK_FILE.match(name)
    return bool(m) and int(m.group(1)) != 0


def collect_alone(folder: Path, sums: dict[str, dict]) -> dict[str, dict]:
    """Rank 0's sums plus the files nobody hashed while writing (a save hook's), leaving out the other ranks'
    parts, which they may still be writing."""
    files = dict(sums)
    for root, _, filenames in os.walk(folder):
        for filename in filenames:
            path = Path(root) / filename
            name = path.relative_to(folder).as_posix()
            if (name in files or filename.startswith(SUMS_PREFIX) or ".tmp" in filename or name == manifest.NAME
                    or _of_another_rank(name)):
                continue
            files[name] = manifest.file_entry(path)
    return files


def move_parts(old: Path, new: Path, at: tuple[int, int]) -> None:
    """The other ranks' parts of this save, written into the folder a replacement has just moved aside, follow
    the new folder. Best effort: a part lost to the race is a one-line note when it is loaded."""
    for path in sorted(old.glob(".rank*.json")):
        m = _PART.match(path.name)
        if not m or m.group(1) == "0" or (new / path.name).exists():
            continue
        part = read_part(old, int(m.group(1)))
        if part is None or point(part) != at:
            continue
        try:
            for name in part["files"]:
                (new / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(old / name, new / name)
            os.replace(path, new / path.name)
        except OSError:
            continue


def write_part(folder: Path, rank: int, extras: dict, staged, at: tuple[int, int], fsync: bool,
               wait_s: float) -> None:
    """A rank other than 0: its part of a replicated save (``extras``, then ``staged``'s files), into ``folder``.
    Rank 0 may be replacing that folder as the part is written (a damaged checkpoint of this step saved again): a
    file of the part then goes with the old folder, or a write finds its place gone. The part is then written again
    once rank 0's new folder is committed at this point (up to ``wait_s``): a crash here would lose the rank, a part
    lost unseen its random streams."""
    for again in (False, True):
        try:
            files = FileSet(folder, rank, fsync=fsync)
            for name, obj in extras.items():
                files.save(name, obj)
            staged.write(folder, files)
            publish_part(folder, rank, files.sums, at, fsync=fsync)
            if all((folder / name).exists() for name in [*files.sums, part_name(rank)]):
                return
        except FileNotFoundError:
            if again:
                raise
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            data = manifest.read(folder)
            if data is not None and point(data) == at:
                break
            time.sleep(0.05)
        folder.mkdir(parents=True, exist_ok=True)
