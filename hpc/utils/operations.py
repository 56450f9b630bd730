"""`accelerate.utils.operations` as hpc spells it: its names, defined in hpc.runtime.operations."""

from hpc.runtime.operations import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    concatenate,
    copy_tensor_to_devices,
    find_batch_size,
    gather,
    gather_object,
    honor_type,
    is_namedtuple,
    is_torch_tensor,
    listify,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
    slice_tensors,
)

__all__ = ["DistributedOperationException", "broadcast", "broadcast_object_list", "concatenate",
           "copy_tensor_to_devices", "find_batch_size", "gather", "gather_object", "honor_type", "is_namedtuple",
           "is_torch_tensor", "listify", "pad_across_processes", "recursively_apply", "reduce", "send_to_device",
           "slice_tensors"]
