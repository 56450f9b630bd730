"""Collectives over tensors and nests of tensors: the one implementation of each, walked by hpc.runtime.process.nest.

Two doors to each. The ``*_across`` functions take the world size (the Accelerator passes its own; a checkpoint
its own); the functions with Accelerate's names and signatures (`hpc.utils`, as `accelerate.utils`) read
it from PartialState, whose first use forms the group when the job has several ranks, and compare the ranks'
shapes first in debug mode (ACCELERATE_DEBUG_MODE), as Accelerate's do. Every rank must make the same calls with
the same nest.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hpc.errors import HpcError
from hpc.runtime.process.nest import recursively_apply

REDUCTIONS = ("mean", "sum", "max", "min", "none")


class DistributedOperationException(HpcError):
    """The ranks called a collective with different shapes (found in debug mode, before it could hang)."""


def _map(fn, data):
    """``fn`` on every tensor of the nest; anything else is refused by name, as Accelerate's collectives do, but
    before the first tensor is sent: a refusal leaves no collective half done."""
    def check(t):
        return t

    check.__name__ = fn.__name__
    recursively_apply(check, data, error_on_other_type=True)
    return recursively_apply(fn, data, error_on_other_type=True)


def _grouped(world: int) -> bool:
    return world > 1 and dist.is_initialized()


# --- with the world size passed in ------------------------------------------------------------------------

def _shapes(data):
    """The nest with each tensor as its shape and any other leaf as its type's name (comparable across ranks)."""
    return recursively_apply(lambda leaf: tuple(leaf.shape) if isinstance(leaf, torch.Tensor)
                             else type(leaf).__name__, data, test_type=lambda leaf: True)


def verify_shapes(data, world: int, operation: str) -> None:
    """Debug mode: ranks holding different shapes would hang in the collective or fail deep inside it;
    compare them first and name each rank's. One all_gather_object per call."""
    if not _grouped(world):
        return
    shapes = gather_object_across(_shapes(data), world)
    if any(s != shapes[0] for s in shapes):
        listed = "; ".join(f"rank {r}: {s}" for r, s in enumerate(shapes))
        raise DistributedOperationException(f"{operation}: the ranks hold different shapes ({listed})",
                                            fix="pad with pad_across_processes first, or give every rank the same "
                                                "shapes")


def gather_object_across(obj, world: int) -> list:
    """Every rank's picklable object, by rank (just [obj] without a process group)."""
    if not _grouped(world):
        return [obj]
    out: list = [None] * world
    dist.all_gather_object(out, obj)
    return out


def gather_across(data, world: int):
    """Every rank's tensors, concatenated along dim 0 (rank 0's first; a 0-d tensor counts as shape [1]).
    Shapes must agree but in dim 0."""
    if world == 1:  # as Accelerate's: what one process holds is already everything
        return data

    def _gather(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous() if t.dim() else t.reshape(1)
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t)
        return torch.cat(parts, dim=0)

    return _map(_gather, data)


def reduce_across(data, world: int, reduction: str = "mean"):
    """Every tensor reduced over the ranks into a new tensor (also with one process). "none" sums without
    dividing, as Accelerate's does; "max" and "min" are hpc's additions."""
    if reduction not in REDUCTIONS:
        raise HpcError(f"reduce(reduction={reduction!r}) is not known", fix=f"use one of {', '.join(REDUCTIONS)}")
    op = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(reduction, dist.ReduceOp.SUM)

    def _reduce(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        if world > 1:
            dist.all_reduce(out, op=op)
            if reduction == "mean":
                out /= world
        return out

    return _map(_reduce, data)


def pad_across(data, world: int, dim: int = 0, pad_index=0, pad_first: bool = False):
    """Each tensor padded with ``pad_index`` along ``dim`` to the longest any rank holds, so it can be gathered.
    Tensors with fewer dims than ``dim`` needs are left as they are: a nest often mixes per-token outputs with
    per-sample ones (Accelerate does the same)."""
    if world == 1:
        return data

    def _pad_across_processes(t: torch.Tensor) -> torch.Tensor:
        if not -t.dim() <= dim < t.dim():
            return t
        d = dim % t.dim()
        longest = int(gather_across(torch.tensor([t.shape[d]], device=t.device), world).max())
        if t.shape[d] == longest:
            return t
        shape = list(t.shape)
        shape[d] = longest
        out = t.new_full(shape, pad_index)
        index = [slice(None)] * t.dim()
        index[d] = slice(longest - t.shape[d], longest) if pad_first else slice(0, t.shape[d])
        out[tuple(index)] = t
        return out

    return _map(_pad_across_processes, data)


def broadcast_across(data, world: int, from_process: int = 0):
    """Rank ``from_process``'s tensors copied into every rank's (in place; shapes and dtypes must agree)."""
    _check_rank(from_process, world, "broadcast")

    def _broadcast(t: torch.Tensor) -> torch.Tensor:
        if _grouped(world):
            dist.broadcast(t, src=from_process)
        return t

    return _map(_broadcast, data)


def broadcast_object_list_across(object_list: list, world: int, from_process: int = 0) -> list:
    """Rank ``from_process``'s picklable objects written into every rank's list (in place), which is returned."""
    if not isinstance(object_list, list):
        raise HpcError("broadcast_object_list takes a list (it is filled in place), "
                       f"not a {type(object_list).__name__}", fix="pass a list of the same length on every rank")
    _check_rank(from_process, world, "broadcast_object_list")
    if _grouped(world):
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def _check_rank(rank: int, world: int, operation: str) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise HpcError(f"{operation}(from_process={rank!r}) is not a rank of this job of {world}",
                       fix=f"use 0 to {world - 1}")


# --- Accelerate's names and signatures, over PartialState's group -------------------------------------------

def _state():
    from hpc.runtime.process.state import PartialState  # the state imports the runtime: only when first called

    return PartialState()


def _world(data, operation: str) -> int:
    state = _state()
    if state.num_processes > 1 and state.debug:
        verify_shapes(data, state.num_processes, operation)
    return state.num_processes


def gather(tensor):
    """Every rank's tensors, concatenated along dim 0 in rank order (a 0-d tensor counts as shape [1])."""
    return gather_across(tensor, _world(tensor, "gather"))


def gather_object(object):  # noqa: A002 - Accelerate's parameter name
    """Every rank's list, concatenated into one flat list in rank order (Accelerate's flattening)."""
    if not isinstance(object, (list, tuple)):
        raise HpcError("gather_object takes a list (each rank's items are concatenated), "
                       f"not a {type(object).__name__}", fix="wrap it: gather_object([obj])")
    return [item for part in gather_object_across(list(object), _state().num_processes) for item in part]


def broadcast(tensor, from_process: int = 0):
    """Rank ``from_process``'s tensors copied into every rank's (in place; shapes and dtypes must agree)."""
    return broadcast_across(tensor, _world(tensor, "broadcast"), from_process)


def broadcast_object_list(object_list: list, from_process: int = 0) -> list:
    """Rank ``from_process``'s picklable objects written into every rank's list (in place), which is returned."""
    return broadcast_object_list_across(object_list, _state().num_processes, from_process)


def reduce(tensor, reduction: str = "mean", scale: float = 1.0):
    """Every tensor reduced over the ranks; a new tensor even with one process. ``scale`` is Accelerate's, which
    applies it on TPUs (XLA) only: on CPUs and GPUs the result is not scaled, there as here."""
    return reduce_across(tensor, _world(tensor, "reduce"), reduction)


def pad_across_processes(tensor, dim: int = 0, pad_index=0, pad_first: bool = False):
    """Each tensor padded with ``pad_index`` along ``dim`` to the longest any rank holds, so it can be gathered."""
    return pad_across(tensor, _world(tensor, "pad_across_processes"), dim, pad_index, pad_first)


def copy_tensor_to_devices(tensor=None):
    """The main process's tensor on every rank's device; the other ranks pass None (they need not know its shape)."""
    state = _state()
    if state.num_processes == 1:
        return tensor
    box = [tensor.cpu() if state.is_main_process else None]
    dist.broadcast_object_list(box, src=0)
    return box[0].to(state.device)
