"""`accelerate.accelerator`: `from hpc.accelerator import Accelerator` (the class lives in hpc.runtime)."""

from hpc.runtime.accelerator import Accelerator

__all__ = ["Accelerator"]
