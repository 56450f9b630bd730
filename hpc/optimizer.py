"""`accelerate.optimizer` as hpc spells it: the class `prepare()` wraps each optimizer in (scripts check
`isinstance(opt, AcceleratedOptimizer)`), defined in hpc.runtime.training.wrappers."""

from hpc.runtime.training.wrappers import AcceleratedOptimizer, move_to_device, patch_optimizer_step
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ["AcceleratedOptimizer", "move_to_device", "patch_optimizer_step"]

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.state": ["AcceleratorState", "GradientState"],
    "hpc.utils": ["DistributedType", "honor_type", "is_lomo_available", "is_torch_xla_available"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
