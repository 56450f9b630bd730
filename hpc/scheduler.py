"""`accelerate.scheduler` as hpc spells it: the class `prepare()` wraps each learning-rate scheduler in, defined in
hpc.runtime.training.wrappers."""

from hpc.runtime.training.wrappers import AcceleratedScheduler

__all__ = ["AcceleratedScheduler"]
