"""`accelerate.parallelism_config`: ParallelismConfig."""

from hpc.runtime.parallel.mesh import ParallelismConfig
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ["ParallelismConfig"]

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.accelerator": ["Accelerator"],
    "hpc.utils": ["DeepSpeedSequenceParallelConfig", "DistributedType", "TorchContextParallelConfig",
                  "TorchTensorParallelConfig", "is_torch_version"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
