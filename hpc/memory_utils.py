"""`accelerate.memory_utils` as hpc spells it (Accelerate keeps the module for older imports; the names live in
hpc.utils.memory)."""

from hpc.runtime.training.batch_memory import find_executable_batch_size, release_memory

__all__ = ["find_executable_batch_size", "release_memory"]
