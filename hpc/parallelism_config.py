"""`accelerate.parallelism_config`: ParallelismConfig."""

from hpc.runtime.parallelism import ParallelismConfig

__all__ = ["ParallelismConfig"]
