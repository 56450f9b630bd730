"""What this rank holds in tensors: every live tensor's storage counted once (views and shards share one).

Used to measure what a strategy really keeps per rank (parameters, gradients, optimizer state, master
copies); tensors held only inside C++ (autograd's saved activations, DDP's communication buckets) are not seen.
"""

from __future__ import annotations

import gc
import warnings

import torch


def _storages() -> dict[int, int]:
    found: dict[int, int] = {}

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
            found[storage.data_ptr()] = max(found.get(storage.data_ptr(), 0), storage.nbytes())

    with warnings.catch_warnings():  # isinstance() on every live object wakes deprecated lazy modules
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor):
                add(obj)
                if obj.is_leaf and obj.grad is not None:  # a gradient may have no Python object of its own yet
                    add(obj.grad)
    return found


def snapshot() -> dict[int, int]:
    """Every live tensor storage (address -> bytes) now."""
    gc.collect()
    return _storages()


def held_since(before: dict[int, int]) -> int:
    """Bytes in storages that are alive now and were not in ``before``."""
    return sum(n for ptr, n in snapshot().items() if ptr not in before)
