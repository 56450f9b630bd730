"""`accelerate.optimizer` as hpc spells it: the class `prepare()` wraps each optimizer in (scripts check
`isinstance(opt, AcceleratedOptimizer)`), defined in hpc.runtime.training.wrappers."""

from hpc.runtime.training.wrappers import AcceleratedOptimizer

__all__ = ["AcceleratedOptimizer"]
