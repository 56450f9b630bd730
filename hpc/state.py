"""`accelerate.state` as hpc spells it: its names, defined in hpc.runtime.process.state and gradient_state."""

from hpc.runtime.process.gradient_state import GradientState
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

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "attach_accelerator",
           "check_not_reset", "distributed_type_of", "is_initialized", "wait_for_everyone"]
