"""`accelerate.hooks` as hpc spells it: its names, defined in hpc.runtime.big_models.hooks."""

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
    remove_hook_from_module,
    remove_hook_from_submodules,
)

__all__ = ['AlignDevicesHook', 'CpuOffload', 'ModelHook', 'SequentialHook', 'UserCpuOffloadHook', 'add_hook_to_module',
           'attach_align_device_hook', 'attach_align_device_hook_on_blocks', 'attach_execution_device_hook',
           'remove_hook_from_module', 'remove_hook_from_submodules']
