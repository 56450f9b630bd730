"""Which part of every sequence a context-parallel rank holds.

The sequence is cut into 2 x cp chunks and rank r holds the r-th from the front and the r-th from the back: under
causal attention an early chunk attends to little and a late one to much, so each rank gets as much work. torch's
ring attention cuts the same way (its head-tail load balancer); hpc's gathered attention uses this module.
"""

from __future__ import annotations

import torch

from hpc.errors import HpcError


def positions(length: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """The sequence positions rank `rank` of `cp` holds, in the order it holds them."""
    if length % (2 * cp):
        raise HpcError(f"context parallelism: sequence length {length} does not cut into 2 x cp_size = {2 * cp} "
                       "equal chunks", fix=f"pad the sequences to a multiple of {2 * cp}")
    size = length // (2 * cp)
    front = torch.arange(rank * size, (rank + 1) * size, device=device)
    back = torch.arange((2 * cp - 1 - rank) * size, (2 * cp - rank) * size, device=device)
    return torch.cat([front, back])


def every_rank(length: int, cp: int, device=None) -> torch.Tensor:
    """The positions of all ranks' shards, rank after rank: what an all-gather along the sequence holds."""
    return torch.cat([positions(length, cp, r, device) for r in range(cp)])


def shard_in_place(buffer: torch.Tensor, dim: int, where: torch.Tensor) -> None:
    """The buffer becomes this rank's part of itself (the caller's tensor object, as torch's context_parallel
    changes it: the script's batch dict then holds the shard), on storage of its own: buffers that are views of one
    sequence (ids = seq[:, :-1], labels = seq[:, 1:]) would otherwise overwrite each other's data."""
    buffer.set_(buffer.index_select(dim, where.to(buffer.device)))


def restore_in_place(buffer: torch.Tensor, original: torch.Tensor) -> None:
    buffer.set_(original)


def make_private(buffers: list[torch.Tensor]) -> None:
    """Each buffer on storage of its own before torch's context_parallel writes shards into them in place (a view
    shares its base's storage with the other views of it); the tensors the script holds keep their values."""
    for buffer in buffers:
        buffer.set_(buffer.clone(memory_format=torch.contiguous_format))
