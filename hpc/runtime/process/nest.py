"""Nested data on one rank: the one walk over nests that every collective, device move and batch cut uses, and the
local transforms built on it (Accelerate's send_to_device, find_batch_size, concatenate, listify, slice_tensors).

The walk has Accelerate's rules: lists and tuples keep their type (a namedtuple is rebuilt from its fields), any
Mapping keeps its type where its constructor takes a dict (a tokenizer's BatchEncoding is a UserDict, transformers'
ModelOutput an OrderedDict; a defaultdict keeps its factory; any other becomes a dict rather than failing), and a
dataclass that is neither is rebuilt with its walked fields (fields that are not tensors are kept as they are:
Accelerate does not walk dataclasses at all). Other leaves that are not tensors are kept, or refused by name.
Collectives across ranks are in hpc.runtime.process.collectives.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Mapping

import torch

from hpc.errors import HpcError


def is_torch_tensor(data) -> bool:
    return isinstance(data, torch.Tensor)


def is_namedtuple(data) -> bool:
    return isinstance(data, tuple) and hasattr(data, "_asdict") and hasattr(data, "_fields")


def honor_type(obj, generator):
    """The generator's items as obj's type (list, tuple, namedtuple: the last takes them as arguments)."""
    return type(obj)(*list(generator)) if is_namedtuple(obj) else type(obj)(generator)


def is_dataclass_instance(data) -> bool:
    return dataclasses.is_dataclass(data) and not isinstance(data, type)


def _is_container(data) -> bool:
    return isinstance(data, (list, tuple, Mapping))


def _rebuild_mapping(like: Mapping, items: dict) -> Mapping:
    if isinstance(like, defaultdict):
        return type(like)(like.default_factory, items)
    try:
        return type(like)(items)
    except TypeError:  # a Mapping whose constructor takes something else: its values matter more than its type
        return dict(items)


def walk(func, data, *others, is_leaf=is_torch_tensor, strict: bool = False, skip_keys=()):
    """``func(leaf, *the leaves at the same place in others)`` on every leaf of ``data`` that ``is_leaf`` accepts
    (asked before anything else, so a leaf may be a container: a BatchEncoding has ``.to``); containers rebuilt as
    their own type. ``others`` are nests shaped like ``data`` walked in step (concatenate's batches). A mapping's
    values under ``skip_keys`` are kept; other leaves are kept, or refused with ``strict``."""

    def visit(item, rest, strict):
        if is_leaf(item):
            return func(item, *rest)
        if isinstance(item, (tuple, list)):
            return honor_type(item, (visit(v, [o[i] for o in rest], strict) for i, v in enumerate(item)))
        if isinstance(item, Mapping):
            return _rebuild_mapping(item, {k: v if k in skip_keys else visit(v, [o[k] for o in rest], strict)
                                           for k, v in item.items()})
        if is_dataclass_instance(item):  # its other fields (a name, a flag) are its own, kept as they are
            return dataclasses.replace(item, **{f.name: visit(getattr(item, f.name),
                                                              [getattr(o, f.name) for o in rest], False)
                                                for f in dataclasses.fields(item) if f.init})
        if strict:
            name = getattr(func, "__name__", "this operation").lstrip("_")
            raise HpcError(f"{name} got a {type(item).__name__}: it takes tensors, or lists, tuples, dicts and "
                           "dataclasses of them", fix="convert it to a tensor first (gather_object takes any "
                                                      "picklable object)")
        return item

    return visit(data, others, strict)


def recursively_apply(func, data, *args, test_type=is_torch_tensor, error_on_other_type: bool = False, **kwargs):
    """Accelerate's: ``func(leaf, *args, **kwargs)`` on every leaf passing ``test_type``; containers rebuilt as
    their own type (a container is walked even if it passes ``test_type``, as there). Other leaves are kept, or
    refused with ``error_on_other_type``."""
    apply = functools.update_wrapper(lambda leaf: func(leaf, *args, **kwargs), func) if args or kwargs else func
    return walk(apply, data, is_leaf=lambda item: not _is_container(item) and test_type(item),
                strict=error_on_other_type)


def leaves(data, is_leaf=None) -> list:
    """The nest's leaves in walk order: those ``is_leaf`` accepts, or every item that is no container."""
    found: list = []

    def keep(leaf):
        found.append(leaf)
        return leaf

    walk(keep, data, is_leaf=is_leaf or (lambda item: not _is_container(item) and not is_dataclass_instance(item)))
    return found


def all_tensors(data) -> bool:
    """Whether the nest holds tensors and nothing else (an empty one counts as not)."""
    found = leaves(data)
    return bool(found) and all(isinstance(leaf, torch.Tensor) for leaf in found)


def send_to_device(tensor, device, non_blocking: bool = False, skip_keys=None):
    """Every tensor (and anything with ``.to``, e.g. a tokenizer's BatchEncoding) in the nest moved to ``device``;
    a mapping's values under ``skip_keys`` stay where they are. Accelerate's; also what a prepared loader yields."""

    def move(leaf):
        try:
            return leaf.to(device, non_blocking=non_blocking)
        except TypeError:  # a .to() without non_blocking
            return leaf.to(device)

    skip = (skip_keys,) if isinstance(skip_keys, str) else tuple(skip_keys or ())
    return walk(move, tensor, is_leaf=lambda item: hasattr(item, "to"), skip_keys=skip)


def find_batch_size(data) -> int:
    """dim 0 of the first tensor in the nest that has one."""
    found = leaves(data, is_leaf=lambda item: isinstance(item, torch.Tensor) and item.dim() > 0)
    if not found:
        raise HpcError(f"find_batch_size found no tensor with a batch dim in a {type(data).__name__}",
                       fix="pass the batch (a tensor, or lists, tuples and dicts of them)")
    return found[0].shape[0]


def concatenate(data, dim: int = 0):
    """A list of equally nested batches as one nest, each tensor concatenated along ``dim``."""
    if not isinstance(data, (list, tuple)) or not data:
        raise HpcError("concatenate takes a non-empty list of batches", fix="pass [batch1, batch2, ...]")

    def _concatenate(*parts):
        return torch.cat(parts, dim=dim)

    # one batch is returned whole, whatever it holds; several join their tensors only, as Accelerate's
    return walk(_concatenate, data[0], *data[1:], strict=len(data) > 1)


def listify(data):
    """Tensors as (nested) Python lists, e.g. to write them to JSON."""
    def _listify(t):
        t = t.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).tolist()

    return recursively_apply(_listify, data)


def slice_tensors(data, tensor_slice, process_index=None, num_processes=None):
    """``t[tensor_slice]`` of every tensor in the nest (the last two arguments are Accelerate's, unused there too)."""
    def _slice(t):
        return t[tensor_slice]

    return recursively_apply(_slice, data)


def truncate(data, n: int):
    """Every tensor's first ``n`` rows (gather_for_metrics drops what the last batch repeated)."""
    return slice_tensors(data, slice(None, n))
