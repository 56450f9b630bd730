"""Measuring, cutting and joining collated batches (tensors, and dicts, lists, tuples of them) along dim 0.

A stream's final round is filled up, and split_batches cuts a batch, after collation; a list of plain
values (strings, numbers: what default_collate leaves of a text field) is data and is cut like a tensor.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hpc.errors import HpcError


def _is_data_list(x) -> bool:
    return isinstance(x, (list, tuple)) and not hasattr(x, "_fields") and all(
        not isinstance(v, (torch.Tensor, Mapping, list, tuple)) for v in x)


class BatchOps:
    @staticmethod
    def size(batch) -> int:
        if isinstance(batch, torch.Tensor):
            return batch.shape[0] if batch.dim() else 1
        if _is_data_list(batch):
            return len(batch)
        values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
        for v in values:
            return BatchOps.size(v)
        raise HpcError(f"cannot tell the size of a batch of type {type(batch).__name__}",
                       fix="collate batches into tensors (or dicts, lists, tuples of them)")

    @staticmethod
    def take(batch, a: int, b: int):
        if isinstance(batch, torch.Tensor) or _is_data_list(batch):
            return batch[a:b]
        return _rebuild(batch, [BatchOps.take(v, a, b) for v in _values(batch)])

    @staticmethod
    def join(batches: list):
        first = batches[0]
        if isinstance(first, torch.Tensor):
            return torch.cat(batches)
        if _is_data_list(first):
            return type(first)(v for b in batches for v in b)
        columns = zip(*(_values(b) for b in batches))
        return _rebuild(first, [BatchOps.join(list(c)) for c in columns])


def _values(batch) -> list:
    return list(batch.values()) if isinstance(batch, Mapping) else list(batch)


def _rebuild(like, values: list):
    if isinstance(like, Mapping):
        return type(like)(zip(like.keys(), values))
    if hasattr(like, "_fields"):  # a namedtuple
        return type(like)(*values)
    return type(like)(values)
