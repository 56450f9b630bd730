"""`accelerate.local_sgd` as hpc spells it: its names, defined in hpc.runtime.training.local_sgd."""

from hpc.runtime.training.local_sgd import (
    DistributedType,
    LocalSGD,
    distributed_type_of,
)
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ['DistributedType', 'LocalSGD', 'distributed_type_of']

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.accelerator": ["Accelerator"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
