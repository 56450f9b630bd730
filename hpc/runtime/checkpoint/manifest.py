"""The commit record of a checkpoint: every file's size and CRC-32, written last by an atomic rename.

A step folder without `manifest.json` is not a checkpoint (a save was cut short); one whose files do not
match their manifest is damaged and is never loaded.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpc.runtime.checkpoint.crc import crc32

NAME = "manifest.json"
VERSION = 1
_CHUNK = 8 << 20


def file_entry(path: Path) -> dict:
    """A file's manifest entry: size and CRC-32 (hex), read in chunks (the CRC releases the GIL for them)."""
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            crc = crc32(chunk, crc)
            size += len(chunk)
    return {"size": size, "crc32": f"{crc:08x}"}


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: dict, fsync: bool = True) -> None:
    """Write to a temporary name in the same folder, then rename: readers see all of it or none."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def commit(folder: Path, files: dict[str, dict], meta: dict, fsync: bool = True) -> None:
    write_json_atomic(folder / NAME, {"version": VERSION, "committed_at": time.time(), "files": files, **meta}, fsync)


def read(folder: Path) -> dict | None:
    """The manifest, or None when the folder was never committed (or its manifest is unreadable)."""
    try:
        with open(folder / NAME) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def _check(folder: Path, name: str, want: dict) -> str | None:
    path = folder / name
    if not path.is_file():
        return f"{path}: missing (the manifest lists it)"
    size = path.stat().st_size
    if size != want["size"]:
        return f"{path}: {size} bytes, the manifest says {want['size']} (truncated or replaced)"
    crc = file_entry(path)["crc32"]
    if crc != want["crc32"]:
        return f"{path}: checksum {crc} does not match the manifest's {want['crc32']} (the file is corrupt)"
    return None


def verify(folder: Path, files: dict[str, dict], names: list[str] | None = None) -> str | None:
    """None when the named files (all by default) match; otherwise what is wrong, in one line.
    Files are checked on several threads (the CRC releases the GIL)."""
    names = sorted(files) if names is None else names
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names), os.cpu_count() or 1))) as pool:
        problems = list(pool.map(lambda name: _check(folder, name, files[name]), names))
    return next((p for p in problems if p), None)
