"""`accelerate.big_modeling` as hpc spells it: its names, defined in hpc.runtime.big_models."""

from hpc.runtime.big_models.casting import (
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING,
    LayerwiseCastingHook,
    attach_layerwise_casting_hooks,
)
from hpc.runtime.big_models.device_map import check_device_map, get_balanced_memory, infer_auto_device_map
from hpc.runtime.big_models.dispatch import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
)
from hpc.runtime.big_models.empty_init import init_empty_weights, init_on_device
from hpc.runtime.big_models.hooks import (
    AlignDevicesHook,
    CpuOffload,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from hpc.runtime.big_models.loading import load_checkpoint_in_model
from hpc.runtime.big_models.module_tensors import recursive_getattr
from hpc.runtime.big_models.offload import OffloadedWeightsLoader, extract_submodules_state_dict, offload_state_dict
from hpc.runtime.big_models.sizes import find_tied_parameters, retie_parameters
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ['SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING', 'AlignDevicesHook', 'CpuOffload', 'LayerwiseCastingHook',
           'OffloadedWeightsLoader', 'UserCpuOffloadHook', 'add_hook_to_module', 'attach_align_device_hook',
           'attach_align_device_hook_on_blocks', 'attach_layerwise_casting_hooks', 'check_device_map', 'cpu_offload',
           'cpu_offload_with_hook', 'disk_offload', 'dispatch_model', 'extract_submodules_state_dict',
           'find_tied_parameters', 'get_balanced_memory', 'infer_auto_device_map', 'init_empty_weights',
           'init_on_device', 'load_checkpoint_and_dispatch', 'load_checkpoint_in_model', 'offload_state_dict',
           'recursive_getattr', 'retie_parameters']

# what Accelerate's module also binds from its other modules, each from its own hpc path (and its
# `logger`, a multi-process logger of its own)
_ALSO = {
    "hpc.utils": ["check_cuda_p2p_ib_support", "is_bnb_available", "is_mlu_available", "is_musa_available",
                  "is_neuron_available", "is_npu_available", "is_sdaa_available", "is_xpu_available",
                  "parse_flag_from_env"],
}
_FORWARD = Forwarding(__name__, _ALSO, logger=True)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
