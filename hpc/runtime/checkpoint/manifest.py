"""The commit record of a checkpoint: every file's size and CRC-32, written last by an atomic rename.

A step folder without `manifest.json` is not a checkpoint (a save was cut short); one whose manifest is
malformed (a format hpc never writes included), or whose files do not match it, is damaged and is never loaded.
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpc.contract.atomic import atomic_write
from hpc.runtime.checkpoint.crc import crc32
from hpc.runtime.data.position import UNITS

NAME = "manifest.json"
VERSION = 1
# The formats hpc writes, one per strategy (formats.py's FullFormat, DcpFormat, DeepSpeedFormat; a test keeps the
# two equal). A manifest naming another was not written by hpc: it is damage, skipped for the checkpoint before
# it, not a checkpoint of some other strategy that stops the job.
FORMATS = ("full", "dcp", "deepspeed")
# the fast tier's folder of a rank not first on its node: its random streams and readers only, the replicated state
# being in its node's first rank's folder (tiers/fast_tier.py); never a checkpoint to load by itself
PART = "part"
# the fast tier's folder of a rank of a sharded model (FSDP): its own shards as plain tensors, with its streams and
# readers; read back at the same world size and layout only (checkpoint/local_shards.py)
SHARD = "shard"
FAST_TIER_FORMATS = ("full", PART, SHARD)  # what a fast-tier folder may hold (checked with formats=)
_CHUNK = 8 << 20
_CRC = re.compile(r"^[0-9a-f]{8}$")


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
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True), fsync=fsync)
    if fsync:
        fsync_dir(path.parent)


def commit(folder: Path, files: dict[str, dict], meta: dict, fsync: bool = True) -> None:
    write_json_atomic(folder / NAME, {"version": VERSION, "committed_at": time.time(), "files": files, **meta}, fsync)


def read(folder: Path) -> dict | None:
    """The manifest, or None when the folder was never committed (no manifest, or one cut short). A manifest
    that parses is a commit, well formed or not: malformed() tells, and a malformed one is damage."""
    try:
        with open(folder / NAME) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else {"files": None, "not_an_object": type(data).__name__}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry_problem(name, want) -> str | None:
    if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
        return f"file name {name!r} is not a path inside the folder"
    if not isinstance(want, dict) or not _is_int(want.get("size")) or want["size"] < 0 \
            or not isinstance(want.get("crc32"), str) or not _CRC.match(want["crc32"]):
        return f"the entry of {name} is not {{size, crc32}}"
    return None


def files_problem(files) -> str | None:
    """What is wrong with a ``files`` mapping's shape (name -> {size, crc32}), or None."""
    if not isinstance(files, dict):
        return f"its files is a {type(files).__name__}, not a mapping"
    return next((p for name, want in files.items() if (p := _entry_problem(name, want))), None)


def malformed(data: dict, folder: Path | None = None, formats: tuple[str, ...] = FORMATS) -> str | None:
    """None when a manifest's shape is what hpc writes; else one line saying what is wrong."""
    if "not_an_object" in data:
        problem = f"it is a JSON {data['not_an_object']}, not an object"
    else:
        problem = files_problem(data.get("files"))
    for key in ("step", "micro_step", "world_size"):
        if problem is None and key in data and not (_is_int(data[key]) and data[key] >= 0):
            problem = f"its {key} is {data[key]!r}, not a count"
    if problem is None and data.get("format") not in formats:
        problem = (f"its format is {data['format']!r}, not one hpc writes ({', '.join(formats)})" if "format" in data
                   else "it names no format")
    loaders = data.get("loaders", [])
    if problem is None and not (isinstance(loaders, list) and all(
            isinstance(x, dict) and _is_int(x.get("epoch")) and _is_int(x.get("position"))
            and ("consumed" not in x or (_is_int(x["consumed"]) and x["consumed"] >= 0 and x.get("unit") in UNITS))
            for x in loaders)):
        problem = "its loaders are not a list of {epoch, position[, consumed, unit]}"
    if problem is None:
        return None
    where = f"{folder / NAME}" if folder is not None else NAME
    return f"{where} is malformed: {problem}"


def check(folder: Path, data: dict | None, formats: tuple[str, ...] = FORMATS) -> str | None:
    """None when ``folder`` is a well-formed commit whose every file matches; else what is wrong, in one line."""
    if data is None:
        return f"{folder}: no {NAME} (the save never finished)"
    return malformed(data, folder, formats) or verify(folder, data["files"])


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
    """None when the named files (all by default) match; otherwise what is wrong, in one line (a ``files``
    mapping of the wrong shape included). Files are checked on several threads (the CRC releases the GIL)."""
    shape = files_problem(files)
    if shape is not None:
        return f"{folder}: malformed list of files: {shape}"
    names = sorted(files) if names is None else names
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names), os.cpu_count() or 1))) as pool:
        problems = list(pool.map(lambda name: _check(folder, name, files[name]), names))
    return next((p for p in problems if p), None)
