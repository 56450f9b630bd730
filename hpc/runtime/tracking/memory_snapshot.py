"""What this rank holds in tensors: every live tensor's storage counted once (views and shards share one).

Used to measure what a strategy really keeps per rank (parameters, gradients, optimizer state, master
copies); tensors held only inside C++ (autograd's saved activations, DDP's communication buckets) are not seen.
"""

from __future__ import annotations

import gc
import warnings

import torch


def _storages() -> dict[int, torch.UntypedStorage]:
    found: dict[int, torch.UntypedStorage] = {}

    def add(t: torch.Tensor) -> None:
        local = getattr(t, "_local_tensor", None)  # a DTensor: its shard on this rank
        if local is not None:
            t = local
        if t.device.type == "meta":
            return
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # wrapper subclasses without storage of their own
            return
        if storage.nbytes():
            seen = found.get(storage.data_ptr())
            if seen is None or storage.nbytes() > seen.nbytes():
                found[storage.data_ptr()] = storage

    with warnings.catch_warnings():  # isinstance() on every live object wakes deprecated lazy modules
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor):
                add(obj)
                if obj.is_leaf and obj.grad is not None:  # a gradient may have no Python object of its own yet
                    add(obj.grad)
    return found


class Snapshot:
    """The storages alive at one moment, kept alive by it: an address freed later and handed to a new tensor
    would otherwise pass that tensor off as old and undercount what a strategy holds (seen as a flaky
    comparison between two runs in one process)."""

    def __init__(self) -> None:
        gc.collect()
        self._storages = _storages()

    def __contains__(self, ptr: int) -> bool:
        return ptr in self._storages

    def bytes_not_in(self, earlier: Snapshot) -> int:
        return sum(s.nbytes() for ptr, s in self._storages.items() if ptr not in earlier)


def snapshot() -> Snapshot:
    """Every live tensor storage now, pinned until the snapshot is dropped."""
    return Snapshot()


def held_since(before: Snapshot) -> int:
    """Bytes in storages that are alive now and were not alive at ``before``."""
    return snapshot().bytes_not_in(before)
