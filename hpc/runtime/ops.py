"""Collectives over tensors and nests of tensors: the one implementation behind the Accelerator's methods and
hpc.runtime.operations' functions. Nests are walked by hpc.runtime.nest (namedtuples, any Mapping, dataclasses)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hpc.errors import HpcError
from hpc.runtime.nest import recursively_apply


class DistributedOperationException(HpcError):
    """The ranks called a collective with different shapes (found in debug mode, before it could hang)."""


def _map(fn, data):
    """``fn`` on every tensor of the nest; anything else is refused by name, as Accelerate's collectives do."""
    return recursively_apply(fn, data, error_on_other_type=True)


def _shapes(data):
    """The nest with each tensor as its shape and any other leaf as its type's name (comparable across ranks)."""
    return recursively_apply(lambda leaf: tuple(leaf.shape) if isinstance(leaf, torch.Tensor)
                             else type(leaf).__name__, data, test_type=lambda leaf: True)


def verify_shapes(data, world: int, operation: str) -> None:
    """Debug mode: ranks holding different shapes would hang in the collective or fail deep inside it;
    compare them first and name each rank's. One all_gather_object per call."""
    if world <= 1 or not dist.is_initialized():
        return
    shapes = gather_object(_shapes(data), world)
    if any(s != shapes[0] for s in shapes):
        listed = "; ".join(f"rank {r}: {s}" for r, s in enumerate(shapes))
        raise DistributedOperationException(f"{operation}: the ranks hold different shapes ({listed})",
                                            fix="pad with pad_across_processes first, or give every rank the same "
                                                "shapes")


def gather_object(obj, world: int) -> list:
    """Every rank's picklable object, by rank (just [obj] without a process group)."""
    if world <= 1 or not dist.is_initialized():
        return [obj]
    out: list = [None] * world
    dist.all_gather_object(out, obj)
    return out


def gather(data, world: int):
    """Every rank's tensors, concatenated along dim 0 (rank 0's first). Shapes must agree but in dim 0."""
    if world == 1:  # as Accelerate's: what one process holds is already everything
        return data

    def _gather(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous() if t.dim() else t.reshape(1)
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t)
        return torch.cat(parts, dim=0)

    return _map(_gather, data)


REDUCTIONS = ("mean", "sum", "max", "min", "none")


def reduce(data, world: int, reduction: str = "mean"):
    """Every tensor reduced over the ranks into a new tensor (also with one process). "none" sums without
    dividing, as Accelerate's does; "min" is hpc's addition."""
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


def pad_across_processes(data, world: int, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
    """Pad each tensor along ``dim`` to the largest size any rank has, so it can be gathered."""
    if world == 1:
        return data

    def _pad_across_processes(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0:
            return t
        size = torch.tensor([t.shape[dim]], device=t.device)
        sizes = gather(size, world)
        longest = int(sizes.max())
        if t.shape[dim] == longest:
            return t
        shape = list(t.shape)
        shape[dim] = longest
        out = t.new_full(shape, pad_index)
        index = [slice(None)] * t.dim()
        index[dim] = slice(longest - t.shape[dim], longest) if pad_first else slice(0, t.shape[dim])
        out[tuple(index)] = t
        return out

    return _map(_pad_across_processes, data)


def truncate(data, n: int):
    def _truncate(t: torch.Tensor) -> torch.Tensor:
        return t[:n]

    return _map(_truncate, data)
