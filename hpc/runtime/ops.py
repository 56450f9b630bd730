"""Collectives over tensors and nests of tensors (dicts, lists, tuples)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hpc.errors import HpcError


class DistributedOperationException(HpcError):
    """The ranks called a collective with different shapes (found in debug mode, before it could hang)."""


def _map(fn, data):
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, dict):
        return type(data)({k: _map(fn, v) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        return type(data)(_map(fn, v) for v in data)
    return data


def _shapes(data):
    if isinstance(data, torch.Tensor):
        return tuple(data.shape)
    if isinstance(data, dict):
        return {k: _shapes(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_shapes(v) for v in data]
    return type(data).__name__


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
    if world == 1:
        return data

    def one(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous() if t.dim() else t.reshape(1)
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t)
        return torch.cat(parts, dim=0)

    return _map(one, data)


def reduce(data, world: int, op: str = "mean"):
    if world == 1:
        return data
    ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops:
        raise ValueError(f"reduction {op!r}: use one of {', '.join(ops)}")

    def one(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        dist.all_reduce(out, op=ops[op])
        return out / world if op == "mean" else out

    return _map(one, data)


def pad_across_processes(data, world: int, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
    """Pad each tensor along ``dim`` to the largest size any rank has, so it can be gathered."""
    if world == 1:
        return data

    def one(t: torch.Tensor) -> torch.Tensor:
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

    return _map(one, data)


def truncate(data, n: int):
    return _map(lambda t: t[:n], data)
