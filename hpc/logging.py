"""`accelerate.logging` as hpc spells it: its names, defined in hpc.runtime.tracking.rank_logging."""

from hpc.runtime.tracking.rank_logging import (
    MultiProcessAdapter,
    get_logger,
)
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ['MultiProcessAdapter', 'get_logger']

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.state": ["PartialState"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
