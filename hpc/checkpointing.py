"""`accelerate.checkpointing` as hpc spells it: its names, defined in hpc.runtime.checkpoint.accelerate_layout."""

from hpc.runtime.checkpoint.accelerate_layout import (
    load_accelerator_state,
    load_custom_state,
    logger,
    save_accelerator_state,
    save_custom_state,
)

__all__ = ["load_accelerator_state", "load_custom_state", "logger", "save_accelerator_state", "save_custom_state"]
