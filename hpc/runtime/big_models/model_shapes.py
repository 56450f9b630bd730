"""Models built on the meta device and sized, for `hpc estimate-memory MODEL`: a HuggingFace folder's model from
its config.json, or a module:callable's. No memory is allocated and no weights are read, however large the model.
"""

from __future__ import annotations

import importlib
import os

from hpc.contract.model_size import ModelSize
from hpc.errors import HpcError


def build_from_callable(target: str):
    """'package.module:callable' -> the model it builds, on the meta device."""

    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise HpcError(f"cannot load {target!r}: {e}", fix="give module:callable importable from here") from None
    import torch

    with torch.device("meta"):  # no memory is allocated, however large the model
        return factory()


def build_from_folder(folder: str):
    """A HuggingFace model folder -> its AutoModel built from config.json on the meta device. Reads no weights
    and never asks the Hub."""
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        raise HpcError(f"{folder} has no config.json", fix="give the folder that holds the model's config.json")
    try:
        import transformers
    except ImportError as e:
        if e.name != "transformers":  # installed but broken: its own message says what is wrong
            raise
        raise HpcError(f"reading the model folder {folder} needs transformers, which is not installed",
                       fix="pip install transformers") from None
    import torch

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # config sanity warnings would bury the table
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        with torch.device("meta"):  # what accelerate's init_empty_weights does for parameters, without accelerate
            return transformers.AutoModel.from_config(config)
    except (ValueError, KeyError, OSError) as e:  # unknown model_type, bad JSON, custom code: the user's config
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HpcError(f"transformers cannot build a model from {config_path}: {first}",
                       fix="check config.json (model_type and its fields) against the model's own") from None
    finally:
        transformers.logging.set_verbosity(verbosity)


def model_size(model) -> ModelSize:
    """Parameters (shared ones once) and Accelerate's sizes: every parameter and buffer, floating ones at fp32
    whatever dtype config.json asks for (Accelerate builds in fp32; others keep their own size); a layer is
    a module without children or one transformers keeps whole (`_no_split_modules`)."""
    sizes: dict[str, int] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        nbytes = t.numel() * (4 if t.is_floating_point() else t.element_size())
        parts = name.split(".")
        for i in range(len(parts) + 1):
            key = ".".join(parts[:i])
            sizes[key] = sizes.get(key, 0) + nbytes
    keep_whole = set(getattr(model, "_no_split_modules", None) or ())
    best, names = 0, []
    todo = [*model.named_parameters(recurse=False), *model.named_children(), *model.named_buffers(recurse=False)]
    while todo:
        name, item = todo.pop(0)
        children = list(item.named_children()) if hasattr(item, "named_children") else []
        if children and type(item).__name__ not in keep_whole:
            todo = [(f"{name}.{n}", c) for n, c in children] + todo
            continue
        size = sizes.get(name, 0)
        if size > best:
            best, names = size, [name]
        elif size == best:
            names.append(name)
    count = sum(p.numel() for p in model.parameters())
    return ModelSize(count, sizes.get("", 0), best, names)


def count_parameters(target: str) -> int:
    """'package.module:callable' -> the number of parameters of the model it builds, on the meta device."""
    return sum(p.numel() for p in build_from_callable(target).parameters())
