"""`accelerate.checkpointing` as hpc spells it: its names, defined in hpc.runtime.checkpoint.accelerate_layout."""

from hpc.runtime.checkpoint.accelerate_layout import (
    load_accelerator_state,
    load_custom_state,
    logger,
    save_accelerator_state,
    save_custom_state,
)
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ["load_accelerator_state", "load_custom_state", "logger", "save_accelerator_state", "save_custom_state"]

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.state": ["PartialState"],
    "hpc.logging": ["get_logger"],
    "hpc.utils": ["MODEL_NAME", "OPTIMIZER_NAME", "RNG_STATE_NAME", "SAFE_MODEL_NAME", "SAFE_WEIGHTS_NAME",
                 "SAMPLER_NAME", "SCALER_NAME", "SCHEDULER_NAME", "WEIGHTS_NAME", "get_pretty_name",
                 "is_cuda_available", "is_hpu_available", "is_mlu_available", "is_musa_available",
                 "is_neuron_available", "is_sdaa_available", "is_torch_version", "is_torch_xla_available",
                 "is_xpu_available", "load", "save"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
