"""A torch checkpoint file read straight into device memory, its checksum verified in the same pass.

``torch.load(map_location="cuda")`` reads each storage into fresh pageable host memory and copies it to the GPU
synchronously: the read and the copy never overlap, and a pageable copy runs at a fraction of a pinned one's rate.
hpc also verified every byte's CRC in a pass of its own before that. Here the file is memory-mapped
(``weights_only``, as every load: safe_load), each storage is copied once through two reused pinned buffers (the
host fills one while the GPU drains the other, ``non_blocking``), and the CRC runs on another thread over the same
file (it releases the GIL): reading, verifying and copying overlap. Storages shared by several tensors are copied
once and stay shared. Nothing is returned until every copy has landed (a stream sync) and the checksum matched.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from hpc.errors import HpcError
from hpc.runtime.checkpoint import manifest, safe_load

CHUNK = 32 << 20  # per pinned buffer: large copies reach the link's rate, two of them stay small beside the state


@dataclass
class LoadStats:
    """What a load did: for the benchmark's host-side rows and the tests."""

    storages: int = 0
    bytes_copied: int = 0  # host -> device
    chunks: int = 0
    crc_bytes: int = 0  # read by the checksum thread


class _Staging:
    """Two pinned host buffers used in turn; an event says when the device has drained one."""

    def __init__(self, device: torch.device, chunk: int):
        pin = device.type == "cuda"
        self.buffers = [torch.empty(chunk, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self.events = [None, None]
        self.turn = 0

    def copy(self, src: torch.Tensor, dst: torch.Tensor, stats: LoadStats) -> None:
        """``dst[:] = src`` (flat uint8, ``src`` on the host) through the buffers, in chunks."""
        size = self.buffers[0].numel()
        for start in range(0, src.numel(), size):
            end = min(start + size, src.numel())
            i = self.turn
            self.turn ^= 1
            if self.events[i] is not None:
                self.events[i].synchronize()  # the device has read this buffer: it may be refilled
            staged = self.buffers[i][:end - start]
            staged.copy_(src[start:end])  # reads the mapped file (page cache, or the disk) into pinned memory
            dst[start:end].copy_(staged, non_blocking=True)
            if dst.is_cuda:
                self.events[i] = torch.cuda.Event()
                self.events[i].record()
            stats.chunks += 1


def _flat_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _to_device(obj, device: torch.device, staging: _Staging, memo: dict, stats: LoadStats):
    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor or obj.layout != torch.strided or obj.device.type != "cpu":
            return obj.to(device)  # subclasses (DTensor) and odd layouts: torch's own path
        storage = obj.untyped_storage()
        moved = memo.get(storage.data_ptr())
        if moved is None:
            moved = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device)
            staging.copy(_flat_bytes(storage), moved, stats)
            memo[storage.data_ptr()] = moved
            stats.storages += 1
            stats.bytes_copied += storage.nbytes()
        out = torch.empty(0, dtype=obj.dtype, device=device)
        return out.set_(moved.untyped_storage(), obj.storage_offset(), obj.size(), obj.stride())
    if isinstance(obj, dict):
        return type(obj)((k, _to_device(v, device, staging, memo, stats)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_to_device(v, device, staging, memo, stats) for v in obj)
    return obj


def load(path, device, expect: dict | None = None, allow=(), stats: LoadStats | None = None, chunk: int = CHUNK):
    """``torch.load(path, map_location=device, weights_only=True)``, read once. ``expect``: the file's manifest
    entry ({size, crc32}), verified beside the copy; a mismatch is an HpcError and nothing is returned."""
    path, device = Path(path), torch.device(device)
    stats = stats if stats is not None else LoadStats()
    checked: dict = {}
    thread = None
    if expect is not None:
        def crc() -> None:
            try:
                checked["entry"] = manifest.file_entry(path)
            except OSError as e:
                checked["error"] = e

        thread = threading.Thread(target=crc, name="hpc-load-crc", daemon=True)
        thread.start()
    try:
        state = safe_load.load(path, map_location="cpu", allow=allow, mmap=True)
        staging = _Staging(device, chunk)
        out = _to_device(state, device, staging, {}, stats)
        del state
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # every chunk has landed before anyone reads it
    finally:
        if thread is not None:
            thread.join()
    if expect is not None:
        got = checked.get("entry")
        if got is None:
            raise HpcError(f"{path}: unreadable while loading ({checked.get('error')})", fix="pick another checkpoint")
        stats.crc_bytes += got["size"]
        if got["size"] != expect.get("size") or got["crc32"] != expect.get("crc32"):
            raise HpcError(f"{path}: {got['size']} bytes, checksum {got['crc32']}; the manifest says "
                           f"{expect.get('size')} bytes, {expect.get('crc32')} (the file is corrupt)",
                           fix="pick another step folder")
    return out
