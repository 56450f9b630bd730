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

# the other names accelerate.utils takes from this module: hpc.utils's
from hpc.utils import (  # noqa: E402
    CannotPadNestedTensorWarning,
    GatheredParameters,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_device,
    get_data_structure,
    ignorant_find_batch_size,
    initialize_tensors,
    is_tensor_information,
    pad_input_tensors,
)

__all__ = [
    "CannotPadNestedTensorWarning",
    "DistributedOperationException",
    "GatheredParameters",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "get_data_structure",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_tensor",
    "listify",
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
]
