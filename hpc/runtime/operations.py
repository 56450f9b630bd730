"""`accelerate.utils.operations`: collectives and nest helpers as free functions, over PartialState's process group.

No Accelerator is needed: the first call forms the group (PartialState) when the job has several ranks. The
collectives are hpc.runtime.ops's, applied tensor by tensor so that namedtuples and any Mapping keep their type.
Every rank must make the same calls with the same nest; with ACCELERATE_DEBUG_MODE they first compare shapes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from hpc.errors import HpcError
from hpc.runtime import ops
from hpc.runtime.data.prepare import send_to_device  # noqa: F401 - the prepared loader's, public here as in Accelerate
from hpc.runtime.nest import honor_type, is_namedtuple, is_torch_tensor, recursively_apply
from hpc.runtime.ops import DistributedOperationException  # noqa: F401 - raised by the debug-mode shape check

__all__ = ["DistributedOperationException", "broadcast", "broadcast_object_list", "concatenate",
           "copy_tensor_to_devices", "find_batch_size", "gather", "gather_object", "honor_type", "is_namedtuple", "is_torch_tensor", "listify", "pad_across_processes", "recursively_apply",
           "reduce", "send_to_device", "slice_tensors"]


def _state():
    from hpc.runtime.process_state import PartialState

    return PartialState()


def _verified(data, operation: str, world: int):
    if world > 1 and _state().debug:
        ops.verify_shapes(data, world, operation)


def gather(tensor):
    """Every rank's tensors, concatenated along dim 0 in rank order (a 0-d tensor counts as shape [1])."""
    world = _state().num_processes
    _verified(tensor, "gather", world)
    return ops.gather(tensor, world)


def gather_object(object):  # noqa: A002 - Accelerate's parameter name
    """Every rank's list, concatenated into one flat list in rank order (Accelerate's flattening)."""
    if not isinstance(object, (list, tuple)):
        raise HpcError("gather_object takes a list (each rank's items are concatenated), "
                       f"not a {type(object).__name__}", fix="wrap it: gather_object([obj])")
    return [item for part in ops.gather_object(list(object), _state().num_processes) for item in part]


def broadcast(tensor, from_process: int = 0):
    """Rank ``from_process``'s tensors copied into every rank's (in place; shapes and dtypes must agree)."""
    state = _state()
    _check_rank(from_process, state.num_processes, "broadcast")
    _verified(tensor, "broadcast", state.num_processes)

    def _broadcast(t):
        if state.num_processes > 1:
            dist.broadcast(t, src=from_process)
        return t

    return recursively_apply(_broadcast, tensor, error_on_other_type=True)


def broadcast_object_list(object_list: list, from_process: int = 0) -> list:
    """Rank ``from_process``'s picklable objects written into every rank's list (in place), which is returned."""
    if not isinstance(object_list, list):
        raise HpcError("broadcast_object_list takes a list (it is filled in place), "
                       f"not a {type(object_list).__name__}", fix="pass a list of the same length on every rank")
    state = _state()
    _check_rank(from_process, state.num_processes, "broadcast_object_list")
    if state.num_processes > 1:
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def _check_rank(rank: int, world: int, operation: str) -> None:
    if not isinstance(rank, int) or not 0 <= rank < world:
        raise HpcError(f"{operation}(from_process={rank!r}) is not a rank of this job of {world}",
                       fix=f"use 0 to {world - 1}")


def reduce(tensor, reduction: str = "mean", scale: float = 1.0):
    """Every tensor reduced over the ranks; a new tensor even with one process. ``scale`` is Accelerate's, which
    applies it on TPUs (XLA) only: on CPUs and GPUs the result is not scaled, there as here."""
    world = _state().num_processes
    _verified(tensor, "reduce", world)
    return ops.reduce(tensor, world, reduction)


def pad_across_processes(tensor, dim: int = 0, pad_index=0, pad_first: bool = False):
    """Each tensor padded with ``pad_index`` along ``dim`` to the longest any rank holds, so it can be gathered.

    Tensors with fewer dims than ``dim`` needs are left as they are: a nest often mixes per-token outputs with
    per-sample ones (Accelerate does the same)."""
    world = _state().num_processes
    _verified(tensor, "pad_across_processes", world)

    def _pad(t):
        if not -t.dim() <= dim < t.dim():
            return t
        return ops.pad_across_processes(t, world, dim % t.dim(), pad_index, pad_first)

    return recursively_apply(_pad, tensor, error_on_other_type=True)


def copy_tensor_to_devices(tensor=None):
    """The main process's tensor on every rank's device; the other ranks pass None (they need not know its shape)."""
    state = _state()
    if state.num_processes == 1:
        return tensor
    box = [tensor.cpu() if state.is_main_process else None]
    dist.broadcast_object_list(box, src=0)
    return box[0].to(state.device)


def concatenate(data, dim: int = 0):
    """A list of equally nested batches as one nest, each tensor concatenated along ``dim``."""
    if not isinstance(data, (list, tuple)) or not data:
        raise HpcError("concatenate takes a non-empty list of batches", fix="pass [batch1, batch2, ...]")
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return type(first)({k: concatenate([d[k] for d in data], dim=dim) for k in first})
    if isinstance(first, torch.Tensor):
        return torch.cat(list(data), dim=dim)
    if len(data) == 1:
        return first
    raise HpcError(f"concatenate got a {type(first).__name__}: it joins tensors only", fix="convert it to a tensor")


def find_batch_size(data) -> int:
    """dim 0 of the first tensor found in the nest."""
    if isinstance(data, (tuple, list, Mapping)):
        for item in (data.values() if isinstance(data, Mapping) else data):
            try:
                return find_batch_size(item)
            except HpcError:
                continue
    elif isinstance(data, torch.Tensor) and data.dim():
        return data.shape[0]
    raise HpcError(f"find_batch_size found no tensor with a batch dim in a {type(data).__name__}",
                   fix="pass the batch (a tensor, or lists, tuples and dicts of them)")


def listify(data):
    """Tensors as (nested) Python lists, e.g. to write them to JSON."""
    def _listify(t):
        return (t.float() if t.dtype == torch.bfloat16 else t).tolist()

    return recursively_apply(_listify, data)


def slice_tensors(data, tensor_slice, process_index=None, num_processes=None):
    """``t[tensor_slice]`` of every tensor in the nest (the last two arguments are Accelerate's, unused there too)."""
    def _slice(t):
        return t[tensor_slice]

    return recursively_apply(_slice, data)
