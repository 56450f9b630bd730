"""Weights stored in another column order than the model's, shown to DCP in the model's own.

GPT-2's fused q/k/v weights are held in rank-major order under tensor parallelism (parallel/conv1d_parallel.py):
rank r's columns are [q_r k_r v_r], one even shard of a DTensor whose global order is not the model's. Saved as it
is, a checkpoint would hold that order, and would load wrongly under any other layout. Here each such DTensor (the
weights and their optimizer moments) is handed to DCP as ``Columns``: the rank's columns cut at block boundaries,
each piece at its offset in the model's order. DCP writes and reads chunks by offset, so the files hold the model's
own layout, and any layout (plain data parallelism, FSDP, another tp) reads them.
"""

from __future__ import annotations

import re

import torch


class Columns(torch.Tensor):
    """A DTensor's local shard as DCP chunks at their places in the model's column order (torch's checkpoint
    protocol: __create_write_items__, __create_chunk_list__, __get_tensor_shard__). Loading fills the pieces;
    ``written_back`` copies them into the DTensor."""

    @staticmethod
    def __new__(cls, dtensor, pieces):
        view = torch.Tensor._make_wrapper_subclass(cls, dtensor.shape, dtype=dtensor.dtype,
                                                   device=dtensor.to_local().device)
        view.dtensor, view.pieces = dtensor, pieces  # [(global offsets, local column slice, tensor)]
        return view

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise TypeError(f"{func} on a checkpoint's column view: it is read and written by DCP only")

    def __create_write_items__(self, fqn: str, obj) -> list:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        return [WriteItem(index=MetadataIndex(fqn, offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(offsets=offsets, sizes=piece.size()),
                                                      properties=TensorProperties.create_from_tensor(piece),
                                                      size=self.size()))
                for offsets, _, piece in self.pieces]

    def __create_chunk_list__(self) -> list:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        return [ChunkStorageMetadata(offsets=offsets, sizes=piece.size()) for offsets, _, piece in self.pieces]

    def __get_tensor_shard__(self, index) -> torch.Tensor:
        for offsets, _, piece in self.pieces:
            if offsets == index.offset:
                return piece
        raise ValueError(f"{index.fqn}: no piece at {tuple(index.offset or ())} on this rank")

    def written_back(self):
        """The DTensor, its local columns set from the pieces (after a load)."""
        local = self.dtensor.to_local()
        with torch.no_grad():
            for _, (start, stop), piece in self.pieces:
                local[..., start:stop].copy_(piece)
        return self.dtensor


def columns(dtensor, to_original) -> Columns:
    """``dtensor`` (its last dim held in another order) as pieces at their original offsets. ``to_original(i)``:
    for the stored column i, (its column in the model's order, how many columns from i on stay contiguous)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    sizes, offsets = compute_local_shape_and_global_offset(dtensor.shape, dtensor.device_mesh, dtensor.placements)
    local = dtensor.to_local()
    start, end = offsets[-1], offsets[-1] + sizes[-1]
    pieces, at = [], start
    while at < end:
        original, run = to_original(at)
        stop = min(end, at + run)
        pieces.append((torch.Size((*offsets[:-1], original)), (at - start, stop - start),
                       local[..., at - start:stop - start].contiguous()))
        at = stop
    return Columns(dtensor, pieces)


def blocks_to_original(width: int, tp: int, parts: int):
    """to_original for conv1d_parallel's rank-major order: stored block j (of width / (parts x tp)) is rank j //
    parts's part j % parts, which sits at block (part x tp + rank) in the model's order."""
    block = width // (parts * tp)

    def to_original(column: int) -> tuple[int, int]:
        j, within = divmod(column, block)
        rank, part = divmod(j, parts)
        return (part * tp + rank) * block + within, block - within

    return to_original


def shown(state: dict, pattern: re.Pattern, tp: int, parts: int) -> dict:
    """``state`` (nested dicts) with each DTensor whose key matches ``pattern`` as Columns; the rest as it is."""
    from torch.distributed.tensor import DTensor

    def walk(obj, key: str):
        if isinstance(obj, dict):
            return {k: walk(v, f"{key}.{k}" if key else str(k)) for k, v in obj.items()}
        if isinstance(obj, DTensor) and obj.dim() >= 1 and pattern.search(key):
            return columns(obj, blocks_to_original(obj.shape[-1], tp, parts))
        return obj

    return walk(state, "")


def restored(state: dict) -> dict:
    """shown()'s inverse after a load: each Columns written back into its DTensor."""
    if isinstance(state, dict):
        return {k: restored(v) for k, v in state.items()}
    return state.written_back() if isinstance(state, Columns) else state
