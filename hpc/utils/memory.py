"""`accelerate.utils.memory` as hpc spells it: its names, defined in hpc.runtime.training.batch_memory."""

from hpc.runtime.training.batch_memory import (
    clear_device_cache,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)

__all__ = ['clear_device_cache', 'find_executable_batch_size', 'release_memory', 'should_reduce_batch_size']
