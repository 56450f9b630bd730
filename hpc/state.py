"""`accelerate.state` as hpc spells it: its names, defined in hpc.runtime.process (state, gradient_state,
shared_dict)."""

from hpc.runtime.process.gradient_state import GradientState
from hpc.runtime.process.shared_dict import SharedDict, ThreadLocalSharedDict, do_nothing, logger
from hpc.runtime.process.state import (
    AcceleratorState,
    DistributedType,
    PartialState,
    attach_accelerator,
    check_not_reset,
    distributed_type_of,
    is_initialized,
    wait_for_everyone,
)

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "SharedDict",
           "ThreadLocalSharedDict", "attach_accelerator", "check_not_reset", "distributed_type_of", "do_nothing",
           "is_initialized", "logger", "wait_for_everyone"]
