"""`accelerate.utils.operations` as hpc spells it: collectives (hpc.runtime.process.collectives) and one rank's
nest helpers (hpc.runtime.process.nest) as free functions over PartialState's process group; no Accelerator is
needed."""

from hpc.runtime.process.collectives import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
)
from hpc.runtime.process.nest import (
    concatenate,
    find_batch_size,
    honor_type,
    is_namedtuple,
    is_torch_tensor,
    listify,
    recursively_apply,
    send_to_device,
    slice_tensors,
)

__all__ = ["DistributedOperationException", "broadcast", "broadcast_object_list", "concatenate",
           "copy_tensor_to_devices", "find_batch_size", "gather", "gather_object", "honor_type", "is_namedtuple",
           "is_torch_tensor", "listify", "pad_across_processes", "recursively_apply", "reduce", "send_to_device",
           "slice_tensors"]
