"""`accelerate.logging` as hpc spells it: its names, defined in hpc.runtime.tracking.rank_logging."""

from hpc.runtime.tracking.rank_logging import (
    MultiProcessAdapter,
    get_logger,
)

__all__ = ['MultiProcessAdapter', 'get_logger']
