"""The one walk over nested data that every collective and device move uses, with Accelerate's rules.

Lists and tuples keep their type (a namedtuple is rebuilt from its fields), any Mapping keeps its type (a
tokenizer's BatchEncoding is a UserDict, transformers' ModelOutput an OrderedDict), and a dataclass that is
neither is rebuilt with its walked fields (fields that are not tensors are kept as they are: Accelerate does not walk
dataclasses at all). Other leaves that are not tensors are kept, or refused by name.
"""

from __future__ import annotations

import dataclasses
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


def map_fields(obj, fn):
    """A dataclass instance rebuilt with ``fn`` applied to each field its constructor takes."""
    return dataclasses.replace(obj, **{f.name: fn(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init})


def recursively_apply(func, data, *args, test_type=is_torch_tensor, error_on_other_type: bool = False, **kwargs):
    """``func(leaf, *args, **kwargs)`` on every leaf passing ``test_type``; containers rebuilt as their own type.
    Other leaves are kept, or refused with ``error_on_other_type``."""

    def walk(item, strict: bool):
        if isinstance(item, (tuple, list)):
            return honor_type(item, (walk(o, strict) for o in item))
        if isinstance(item, Mapping):
            return type(item)({k: walk(v, strict) for k, v in item.items()})
        if test_type(item):
            return func(item, *args, **kwargs)
        if is_dataclass_instance(item):  # its other fields (a name, a flag) are its own, kept as they are
            return map_fields(item, lambda value: walk(value, False))
        if strict:
            name = getattr(func, "__name__", "this operation").lstrip("_")
            raise HpcError(f"{name} got a {type(item).__name__}: it takes tensors, or lists, tuples, dicts and "
                           "dataclasses of them", fix="convert it to a tensor first (gather_object takes any "
                                                      "picklable object)")
        return item

    return walk(data, error_on_other_type)


def all_tensors(data) -> bool:
    """Whether the nest holds tensors and nothing else (an empty container counts as not)."""
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, Mapping):
        return bool(data) and all(all_tensors(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return bool(data) and all(all_tensors(v) for v in data)
    if is_dataclass_instance(data):
        values = [getattr(data, f.name) for f in dataclasses.fields(data)]
        return bool(values) and all(all_tensors(v) for v in values)
    return False
