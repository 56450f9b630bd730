"""`accelerate.accelerator`: `from hpc.accelerator import Accelerator` (the class lives in hpc.runtime), and the
configuration objects Accelerate's module also exports."""

from hpc.runtime.accelerator import Accelerator
from hpc.runtime.configuration import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration

__all__ = ["Accelerator", "DataLoaderConfiguration", "GradientAccumulationPlugin", "ProjectConfiguration"]
