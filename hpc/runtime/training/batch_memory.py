"""`accelerate.utils.memory`: giving memory back, and finding a batch size that fits."""

from __future__ import annotations

import functools
import gc
import inspect
from typing import Callable

from hpc.errors import HpcError

__all__ = ["clear_device_cache", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"]


def clear_device_cache(garbage_collection: bool = False) -> None:
    """The GPU's cached blocks given back to the driver (after a gc pass if asked): other processes, and a
    smaller retry, can use them."""
    import torch

    if garbage_collection:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_memory(*objects) -> list:
    """A None for each object, to assign back (``a, b = release_memory(a, b)``): the caller's names were the last
    references, and the cache is emptied once they are gone."""
    objects = [None] * len(objects)
    clear_device_cache(garbage_collection=True)
    return objects


_OOM_TEXTS = (" out of memory.", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
              "DefaultCPUAllocator: can't allocate memory")


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether the exception says the batch did not fit (a GPU or CPU out-of-memory, or cuDNN giving up)."""
    import torch

    if isinstance(exception, getattr(torch, "OutOfMemoryError", ())):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1 and isinstance(exception.args[0], str):
        return any(text in exception.args[0] for text in _OOM_TEXTS)
    return False


def find_executable_batch_size(function: Callable | None = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Callable[[], int] | None = None):
    """Decorator: calls ``function(batch_size, *args, **kwargs)``, retrying with a smaller batch size after each
    out-of-memory error (x0.9 as Accelerate 1.14+ does, or what ``reduce_batch_size_fn()`` returns).

    The size that worked is kept for the next call of the decorated function."""
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    if isinstance(starting_batch_size, bool) or not isinstance(starting_batch_size, int) or starting_batch_size < 1:
        raise HpcError(f"find_executable_batch_size(starting_batch_size={starting_batch_size!r}) must be a whole "
                       "number >= 1", fix="use e.g. 128")
    batch_size = starting_batch_size

    def smaller() -> int:
        return int(batch_size * 0.9)

    reduce_fn = reduce_batch_size_fn or smaller

    @functools.wraps(function)
    def decorator(*args, **kwargs):
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            raise HpcError(f"{function.__name__}() was called with the batch size: the decorator passes it itself",
                           fix=f"call {function.__name__}({', '.join(params[1:])}) without batch_size")
        while True:
            if batch_size < 1:
                raise HpcError(f"{function.__name__} ran out of memory at every batch size down to 1",
                               fix="free memory (a smaller model, mixed precision, gradient checkpointing) first")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - anything else is raised again at once
                if not should_reduce_batch_size(error):
                    raise
                clear_device_cache(garbage_collection=True)
                smaller_size = reduce_fn()
                if smaller_size >= batch_size:  # the same size again would run out of memory forever
                    raise HpcError(f"reduce_batch_size_fn returned {smaller_size} after batch size {batch_size} ran "
                                   "out of memory", fix="return a smaller batch size each time") from error
                batch_size = smaller_size

    return decorator
