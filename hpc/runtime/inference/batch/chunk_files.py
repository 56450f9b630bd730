"""A chunk's outputs on disk: written, committed, read back and checked (the names: hpc.contract.batch_outputs).

The data file is written whole and synced before its commit names its size and sha256; the commit is written
whole too. A reader trusts a chunk only through its commit, and reads `pt` files with ``weights_only``: an
output folder on a shared filesystem never runs another user's pickle.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from hpc.contract import batch_outputs as names
from hpc.contract.atomic import atomic_write
from hpc.errors import HpcError


def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode(outputs: Sequence, format: str) -> bytes:
    if format == "jsonl":
        try:
            return "".join(json.dumps(o, default=_jsonable) + "\n" for o in outputs).encode()
        except (TypeError, ValueError) as e:
            raise HpcError(f"an output cannot be written as JSON ({e})",
                           fix="return JSON values (str, numbers, lists, dicts, tensors), or use format='pt'") from None
    buffer = io.BytesIO()
    torch.save(list(outputs), buffer)
    return buffer.getvalue()


def decode(data: bytes, format: str) -> list:
    if format == "jsonl":
        return [json.loads(line) for line in data.decode().splitlines()]
    return torch.load(io.BytesIO(data), weights_only=True)


def commit(output: Path, spec: names.BatchSpec, chunk: int, outputs: Sequence, attempt: str, rank: int) -> dict:
    """Write chunk's outputs and then its commit; returns the commit."""
    items = spec.items_of(chunk)
    if len(outputs) != len(items):
        raise HpcError(f"chunk {chunk} holds items {items.start}..{items.stop - 1} ({len(items)}), but "
                       f"{len(outputs)} outputs were committed for it",
                       fix="commit exactly one output per item of chunk.indices, in that order")
    data = encode(outputs, spec.format)
    folder = output / names.CHUNKS
    atomic_write(folder / names.data_name(chunk, spec.format), data, fsync=True)
    record = {"chunk": chunk, "first": items.start, "count": len(items), "bytes": len(data),
              "sha256": hashlib.sha256(data).hexdigest(), "attempt": attempt, "rank": rank, "time": time.time()}
    atomic_write(folder / names.commit_name(chunk), json.dumps(record) + "\n", fsync=True)
    return record


def read_chunk(output: Path, spec: names.BatchSpec, chunk: int, commit_record: dict) -> list:
    """A committed chunk's outputs, checked against its commit."""
    path = output / names.CHUNKS / names.data_name(chunk, spec.format)
    data = path.read_bytes()
    if len(data) != commit_record["bytes"] or hashlib.sha256(data).hexdigest() != commit_record["sha256"]:
        raise HpcError(f"{path} does not match its commit (damaged or changed after it was written)",
                       fix=f"remove it and {names.commit_name(chunk)}, and run the job again to redo that chunk")
    return decode(data, spec.format)


def write_manifest(output: Path, spec: names.BatchSpec, commits: dict[int, dict]) -> None:
    """Once every chunk is committed: the whole output in one file (any rank that sees it complete may write it:
    the content is the same)."""
    manifest = {**spec.as_dict(), "complete": True,
                "chunks": [{"chunk": c, "file": f"{names.CHUNKS}/{names.data_name(c, spec.format)}",
                            "first": commits[c]["first"], "count": commits[c]["count"],
                            "bytes": commits[c]["bytes"], "sha256": commits[c]["sha256"]} for c in sorted(commits)]}
    atomic_write(output / names.MANIFEST, json.dumps(manifest, indent=1) + "\n", fsync=True)


def read_outputs(output_dir: str | os.PathLike, partial: bool = False) -> Iterator[tuple[int, object]]:
    """(item index, output) for every item, in item order, each chunk checked against its commit. An output
    folder with chunks still missing is an error unless ``partial`` (then only committed chunks are read)."""
    output = Path(output_dir)
    spec = names.read_spec(output)
    if spec is None:
        raise HpcError(f"{output} holds no batch-inference outputs ({names.SPEC} is missing)",
                       fix="point at the output_dir the job wrote")
    commits = names.committed(output, spec)
    missing = spec.num_chunks - len(commits)
    if missing and not partial:
        raise HpcError(f"{output}: {missing} of {spec.num_chunks} chunks are not committed yet",
                       fix="let the job finish (hpc status shows its items), or pass partial=True")
    for chunk in sorted(commits):
        yield from zip(spec.items_of(chunk), read_chunk(output, spec, chunk, commits[chunk]))
