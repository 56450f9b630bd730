"""`accelerate.scheduler` as hpc spells it: the class `prepare()` wraps each learning-rate scheduler in, defined in
hpc.runtime.training.wrappers."""

from hpc.runtime.training.wrappers import AcceleratedScheduler
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ["AcceleratedScheduler"]

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.state": ["AcceleratorState", "GradientState"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
