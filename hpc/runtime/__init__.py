"""The in-job half (the first place torch is imported): Accelerator and friends."""

from hpc.runtime.accelerator import Accelerator
from hpc.runtime.handlers import DistributedDataParallelKwargs, GradScalerKwargs
from hpc.runtime.seed import set_seed

__all__ = ["Accelerator", "DistributedDataParallelKwargs", "GradScalerKwargs", "set_seed"]
