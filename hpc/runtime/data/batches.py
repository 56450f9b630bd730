"""Measuring, cutting and joining collated batches (tensors, and dicts, lists, tuples of them) along dim 0.

A stream's final round is filled up, and split_batches cuts a batch, after collation; a list of plain
values (strings, numbers: what default_collate leaves of a text field) is data and is cut like a tensor.
Batches are walked by hpc.runtime.process.nest: namedtuples and any Mapping keep their type.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hpc.errors import HpcError
from hpc.runtime.process.nest import leaves, walk


def _is_data_list(x) -> bool:
    return isinstance(x, (list, tuple)) and not hasattr(x, "_fields") and all(
        not isinstance(v, (torch.Tensor, Mapping, list, tuple)) for v in x)


def _is_column(x) -> bool:
    """A leaf with one entry per sample."""
    return isinstance(x, torch.Tensor) or _is_data_list(x)


class BatchOps:
    @staticmethod
    def size(batch) -> int:
        columns = leaves(batch, is_leaf=_is_column)
        if not columns:
            raise HpcError(f"cannot tell the size of a batch of type {type(batch).__name__}",
                           fix="collate batches into tensors (or dicts, lists, tuples of them)")
        first = columns[0]
        return len(first) if not isinstance(first, torch.Tensor) else first.shape[0] if first.dim() else 1

    @staticmethod
    def take(batch, a: int, b: int):
        return walk(lambda column: column[a:b], batch, is_leaf=_is_column)

    @staticmethod
    def join(batches: list):
        def _join(*columns):
            if isinstance(columns[0], torch.Tensor):
                return torch.cat(columns)
            return type(columns[0])(v for column in columns for v in column)

        return walk(_join, batches[0], *batches[1:], is_leaf=_is_column)
