"""`accelerate.parallelism_config`: ParallelismConfig."""

from hpc.runtime.parallel.mesh import ParallelismConfig

__all__ = ["ParallelismConfig"]
