"""The folder a batch-inference job writes its outputs to, as the job and `hpc status` both read it.

    <output>/batch.json                the job's shape: items, chunk size, format (a rerun must match it)
    <output>/chunks/<chunk>.<format>   the outputs of items [chunk * chunk_size, (chunk + 1) * chunk_size)
    <output>/chunks/<chunk>.commit     the chunk's commit: its item range, size and sha256, written after the data
    <output>/manifest.json             written once every chunk is committed: each chunk's size and sha256

A chunk counts only once its commit exists and its data file has the size the commit names: a crash between
the two writes leaves an uncommitted chunk (done again), never a half one. Both files take their names by an
atomic rename. Each array task's progress is ``tasks/<task>.items`` in the job folder ("done total").
Torch-free.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpc.errors import HpcError

SPEC = "batch.json"
CHUNKS = "chunks"
MANIFEST = "manifest.json"
COMMIT = "commit"
FORMATS = ("jsonl", "pt")
VERSION = 1
_WIDTH = 8  # chunk numbers padded so that a listing sorts in item order


@dataclass(frozen=True)
class BatchSpec:
    num_items: int
    chunk_size: int
    format: str

    @property
    def num_chunks(self) -> int:
        return -(-self.num_items // self.chunk_size)

    def items_of(self, chunk: int) -> range:
        start = chunk * self.chunk_size
        return range(start, min(start + self.chunk_size, self.num_items))

    def as_dict(self) -> dict:
        return {"version": VERSION, "num_items": self.num_items, "chunk_size": self.chunk_size,
                "format": self.format}


def checked_spec(num_items, chunk_size, format: str) -> BatchSpec:
    """The job's shape from the script's arguments, or a one-line error naming the argument."""
    for name, value in (("num_items", num_items), ("chunk_size", chunk_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise HpcError(f"{name} must be a whole number, not {value!r}", fix=f"pass {name}=len(items)"
                           if name == "num_items" else "pass chunk_size=256, say")
    if num_items < 0:
        raise HpcError(f"num_items is {num_items}", fix="pass the number of items, 0 or more")
    if chunk_size < 1:
        raise HpcError(f"chunk_size is {chunk_size}", fix="pass chunk_size=1 or more")
    if format not in FORMATS:
        raise HpcError(f"unknown output format {format!r}", fix=f"use one of {', '.join(FORMATS)}")
    return BatchSpec(num_items, chunk_size, format)


def data_name(chunk: int, format: str) -> str:
    return f"{chunk:0{_WIDTH}d}.{format}"


def commit_name(chunk: int) -> str:
    return f"{chunk:0{_WIDTH}d}.{COMMIT}"


def read_spec(output: str | os.PathLike) -> BatchSpec | None:
    """The shape an earlier run wrote (None: no run has started here)."""
    path = Path(output) / SPEC
    try:
        data = json.loads(path.read_text())
        return BatchSpec(int(data["num_items"]), int(data["chunk_size"]), str(data["format"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HpcError(f"{path} is not a batch-inference spec ({e})",
                       fix="point output_dir at a folder of its own, or remove the damaged file") from None


def read_commit(chunks: Path, chunk: int) -> dict | None:
    try:
        data = json.loads((chunks / commit_name(chunk)).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("chunk") == chunk else None


def committed(output: str | os.PathLike, spec: BatchSpec, only=None) -> dict[int, dict]:
    """Chunk -> its commit, for every chunk whose commit exists and whose data file has the committed size
    (``only``: a test of chunk numbers, to read only some). One listing of the folder."""
    chunks = Path(output) / CHUNKS
    try:
        names = os.listdir(chunks)
    except FileNotFoundError:
        return {}
    sizes = {}
    suffix = f".{spec.format}"
    for name in names:
        if name.endswith(suffix) and not name.startswith("."):
            try:
                sizes[int(name[:-len(suffix)])] = (chunks / name).stat().st_size
            except (ValueError, OSError):
                continue
    out = {}
    for name in names:
        if not name.endswith(f".{COMMIT}") or name.startswith("."):
            continue
        try:
            chunk = int(name[:-len(COMMIT) - 1])
        except ValueError:
            continue
        if chunk >= spec.num_chunks or (only is not None and not only(chunk)) or chunk not in sizes:
            continue
        commit = read_commit(chunks, chunk)
        if commit is not None and commit.get("bytes") == sizes[chunk]:
            out[chunk] = commit
    return out


def items_done(spec: BatchSpec, chunks) -> int:
    return sum(len(spec.items_of(c)) for c in chunks)


def rank_progress_kind(rank: int) -> str:
    return f"items-r{rank}"


def task_items(start: str | None, ranks: list[str]) -> tuple[int, int] | None:
    """(done, total) of one task from its progress files: the attempt's start and what its ranks committed since
    (a rank file of an earlier attempt, or one cut short, counts nothing)."""
    try:
        head = json.loads(start or "")
        attempt, done, total = str(head["attempt"]), int(head["done"]), int(head["total"])
    except (ValueError, KeyError, TypeError):
        return None
    for text in ranks:
        fields = text.split()
        if len(fields) == 2 and fields[0] == attempt and fields[1].isdigit():
            done += int(fields[1])
    return min(done, total), total
