"""`accelerate.hooks` as hpc spells it: its names, defined in hpc.runtime.big_models.hooks (and the helpers
Accelerate's module imports, which scripts import from it too)."""

from hpc.runtime.big_models.casting import LayerwiseCastingHook
from hpc.runtime.big_models.hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    find_device,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from hpc.runtime.big_models.module_tensors import (
    get_non_persistent_buffers,
    named_module_tensors,
    recursive_getattr,
    set_module_tensor_to_device,
)
from hpc.runtime.big_models.offload import PrefixedDataset
from hpc.runtime.process.nest import send_to_device
from hpc.runtime.process.state import PartialState
from hpc.runtime.training.batch_memory import clear_device_cache
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ['AlignDevicesHook', 'CpuOffload', 'LayerwiseCastingHook', 'ModelHook', 'PartialState', 'PrefixedDataset',
           'SequentialHook', 'UserCpuOffloadHook', 'add_hook_to_module', 'attach_align_device_hook',
           'attach_align_device_hook_on_blocks', 'attach_execution_device_hook', 'clear_device_cache', 'find_device',
           'get_non_persistent_buffers', 'named_module_tensors', 'recursive_getattr', 'remove_hook_from_module',
           'remove_hook_from_submodules', 'send_to_device', 'set_module_tensor_to_device']

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.utils": ["is_mlu_available", "is_musa_available", "is_npu_available"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
