"""Exact attention over a sequence split among context-parallel ranks, for devices torch's ring attention does not
serve (torch 2.13 has ring kernels for CUDA's flash, efficient and cuDNN SDPA only; on the CPU it stops with "no
sharding strategy registered" for the CPU flash kernel).

Each rank gathers every rank's keys and values (the all-gather form of context parallelism) and attends from its own
queries to all of them under the causal mask of their true positions. The gradient of the gathered keys and values
is summed over the ranks and each rank keeps its own part: every rank's queries used every rank's keys. Memory per
rank is the whole sequence's keys and values for one layer at a time, which is what the CPU path can afford; CUDA
keeps torch's ring (keys and values passed around, never all held).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hpc.errors import HpcError


class _GatherSequence(torch.autograd.Function):
    """All ranks' tensors stacked (cp, ...); backward sums the gradient over the ranks and keeps this rank's."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


def gather_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """x's sequence dimension (-2, SDPA's layout) extended to every rank's part, rank after rank."""
    return torch.cat(_GatherSequence.apply(x, group).unbind(0), dim=-2)


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, *,
              sdpa, group, mine: torch.Tensor, everyone: torch.Tensor):
    """torch.nn.functional.scaled_dot_product_attention's signature; `mine` are this rank's sequence positions,
    `everyone` every rank's in gathered order."""
    if attn_mask is not None:
        raise HpcError("context parallelism: an attention mask reached scaled_dot_product_attention, and a mask "
                       "over this rank's part of the sequence cannot stand for the whole",
                       fix="train on unpadded (packed) sequences with causal attention; hpc drops transformers' "
                           "own causal mask itself")
    if not query.shape[-2] == key.shape[-2] == len(mine):
        raise HpcError(f"context parallelism: attention over {query.shape[-2]} queries and {key.shape[-2]} keys, "
                       f"but this rank holds {len(mine)} positions of the split sequence",
                       fix="pass every tensor with a sequence dimension (input_ids, labels, position_ids) in "
                           "maybe_context_parallel(buffers=...); only self-attention over them is split")
    keys, values = gather_sequence(key, group), gather_sequence(value, group)
    mask = mine[:, None] >= everyone[None, :] if is_causal else None
    extra = {"enable_gqa": True} if enable_gqa else {}
    return sdpa(query, keys, values, attn_mask=mask, dropout_p=dropout_p, is_causal=False, scale=scale, **extra)
