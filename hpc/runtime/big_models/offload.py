"""Weights kept off the execution device: in host memory (a state dict) or on disk, read back one tensor at a time.

On disk, each tensor is a raw file ``<name>.dat`` in the offload folder, described by ``index.json`` (``{name:
{"dtype": "float16", "shape": [..]}}``): Accelerate's layout, so a folder either wrote is read by the other. An
index entry may instead name a safetensors file (``{"safetensors_file": path, "weight_name": key}``). Reading maps
the file (``torch.from_file``, private copy-on-write pages; ``safe_open`` for safetensors): a forward touches only
the pages of the layer it runs, and nothing is read while the model is built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import torch

from hpc.contract.atomic import atomic_write
from hpc.errors import HpcError
from hpc.runtime.big_models.module_tensors import set_module_tensor_to_device

INDEX_NAME = "index.json"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")  # numpy's names for every dtype both have: "float16", "bool", ...


def _weight_file(folder, name: str) -> str:
    if "/" in name or "\\" in name or name.startswith("."):
        raise HpcError(f"offloaded weight name {name!r} would be written outside the offload folder",
                       fix="offload tensors by their state-dict names")
    return os.path.join(folder, f"{name}.dat")


def offload_weight(weight: torch.Tensor, weight_name: str, offload_folder, index: dict | None = None) -> dict | None:
    """Write one tensor to ``<offload_folder>/<weight_name>.dat`` and note its dtype and shape in ``index``."""
    path = _weight_file(offload_folder, weight_name)
    flat = weight.detach().to("cpu").contiguous().reshape(-1)
    if flat.dtype == torch.bool:  # torch.from_file has no mapping for bool on every version: bytes are the same
        flat = flat.view(torch.uint8)
    with open(path, "wb"):
        pass  # a new, empty file: an earlier, larger one is not kept under the new data
    if flat.numel():
        # written through a shared mapping: the tensor goes to the page cache without a second copy in memory
        torch.from_file(path, shared=True, size=flat.numel(), dtype=flat.dtype).copy_(flat)
    if index is not None:
        index[weight_name] = {"dtype": _dtype_name(weight.dtype), "shape": list(weight.shape)}
    return index


def load_offloaded_weight(weight_file, weight_info: dict) -> torch.Tensor:
    """The tensor in ``weight_file``, mapped from disk (pages are read when used, and never written back)."""
    shape = tuple(weight_info["shape"])
    dtype = getattr(torch, weight_info["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise HpcError(f"{weight_file}: dtype {weight_info['dtype']!r} in the offload index is not a torch dtype",
                       fix="offload the weights again")
    count = 1
    for dim in shape:
        count *= dim
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    stored = torch.uint8 if dtype == torch.bool else dtype
    expected = count * stored.itemsize
    if os.path.getsize(weight_file) < expected:
        raise HpcError(f"{weight_file} holds {os.path.getsize(weight_file)} bytes; the offload index says "
                       f"{expected}", fix="the offload folder is from another model or was cut short: delete it "
                                          "and offload again")
    tensor = torch.from_file(str(weight_file), shared=False, size=count, dtype=stored)
    if dtype == torch.bool:
        tensor = tensor.view(torch.bool)
    return tensor.reshape(shape)


def save_offload_index(index: dict | None, offload_folder) -> None:
    """Merge ``index`` into the folder's ``index.json`` (created when missing)."""
    if not index:
        return
    path = os.path.join(offload_folder, INDEX_NAME)
    current = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            current = json.load(f)
    current.update(index)
    atomic_write(path, json.dumps(current, indent=2))  # a reader never sees half an index


def offload_state_dict(save_dir, state_dict: dict) -> None:
    """Write every tensor of ``state_dict`` to ``save_dir`` with its index."""
    os.makedirs(save_dir, exist_ok=True)
    index: dict = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


def extract_submodules_state_dict(state_dict: dict, submodule_names: list[str]) -> dict:
    """The entries of ``state_dict`` under the given modules ("h.1" takes "h.1.x", not "h.10.x")."""
    return {key: value for name in submodule_names for key, value in state_dict.items()
            if key == name or key.startswith(name + ".")}


class PrefixedDataset(Mapping):
    """``dataset`` seen from inside one module: key ``weight`` reads ``<prefix>weight``."""

    def __init__(self, dataset: Mapping, prefix: str):
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key):
        return self.dataset[f"{self.prefix}{key}"]

    def __contains__(self, key):
        return f"{self.prefix}{key}" in self.dataset

    def __iter__(self):
        return iter([key for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self):
        return len(self.dataset)


class OffloadedWeightsLoader(Mapping):
    """Weights by name from a host state dict (first) or an offload folder's index, each read when asked for."""

    def __init__(self, state_dict: dict | None = None, save_folder=None, index: Mapping | None = None, device=None):
        if state_dict is None and save_folder is None and index is None:
            raise HpcError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index",
                           fix="pass the folder the weights were offloaded to")
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            path = os.path.join(save_folder, INDEX_NAME)
            if not os.path.isfile(path):
                raise HpcError(f"{save_folder} has no {INDEX_NAME}: it holds no offloaded weights",
                               fix="pass the folder the weights were offloaded to, or offload them again")
            with open(path, encoding="utf-8") as f:
                index = json.load(f)
        self.index = {} if index is None else index
        self.all_keys = list(self.state_dict) + [key for key in self.index if key not in self.state_dict]
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if info.get("safetensors_file") is not None:
            from safetensors import safe_open

            device = "cpu" if self.device is None else self.device
            device = device if isinstance(device, int) else str(device)
            try:
                with safe_open(info["safetensors_file"], framework="pt", device=device) as f:
                    tensor = f.get_tensor(info.get("weight_name", key))
            except TypeError:  # a dtype the device cannot open (bfloat16 on mps): read on the host, then move
                with safe_open(info["safetensors_file"], framework="pt", device="cpu") as f:
                    tensor = f.get_tensor(info.get("weight_name", key))
            if "dtype" in info:
                tensor = tensor.to(getattr(torch, info["dtype"]))
            return tensor.to(device)
        if self.save_folder is None:
            raise KeyError(key)
        return load_offloaded_weight(_weight_file(self.save_folder, key), info)

    def __contains__(self, key) -> bool:
        return key in self.state_dict or key in self.index

    def __iter__(self):
        return iter(self.all_keys)

    def __len__(self):
        return len(self.all_keys)


class TiedWeightsMap(Mapping):
    """A weights map that answers for every name of a tied group from whichever name it holds: a checkpoint keeps
    a tied embedding and LM head once, but each module's hook asks for its own name."""

    def __init__(self, weights: Mapping, tied_groups: list[list[str]]):
        self.weights = weights
        self.alias = {}
        for group in tied_groups:
            present = next((name for name in group if name in weights), None)
            if present is not None:
                self.alias.update({name: present for name in group if name not in weights})

    def __getitem__(self, key):
        return self.weights[self.alias.get(key, key)]

    def __contains__(self, key) -> bool:
        return key in self.alias or key in self.weights

    def __iter__(self):
        return iter([*self.weights, *self.alias])

    def __len__(self):
        return len(self.weights) + len(self.alias)


def load_offloaded_weights(model, index: dict | None, offload_folder) -> None:
    """Put every weight of an offload folder back into ``model`` on the host."""
    for name, info in (index or {}).items():
        weight = load_offloaded_weight(_weight_file(offload_folder, name), info)
        set_module_tensor_to_device(model, name, "cpu", value=weight.clone())
