"""Reading a checkpoint into a model, one tensor at a time: a single file (safetensors, or torch's ``.bin``/``.pt``),
or a folder of shards with its index (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``).

Each tensor goes straight to the device its module is mapped to, or to the offload folder when that is "disk", so
host memory holds what stays on the host plus one tensor, never a whole shard. Torch files are opened with
``weights_only=True`` and memory-mapped: a checkpoint anyone else could have written never runs code here
(hpc.runtime.checkpoint.safe_load has the refusal and its opt-in).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

import torch
from torch import nn

from hpc.errors import HpcError
from hpc.runtime.big_models.device_map import check_devices_available
from hpc.runtime.big_models.module_tensors import (
    get_tensor,
    owner_of,
    same_device,
    set_module_tensor_to_device,
)
from hpc.runtime.big_models.offload import load_offloaded_weights, offload_weight, save_offload_index
from hpc.runtime.big_models.sizes import (
    as_dtype,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    retie_parameters,
)
from hpc.runtime.checkpoint import safe_load

logger = logging.getLogger(__name__)

SAFE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_NAME = "pytorch_model.bin"
SAFE_INDEX_NAME = "model.safetensors.index.json"
INDEX_NAME = "pytorch_model.bin.index.json"
WEIGHTS_INDEX_NAME = INDEX_NAME  # Accelerate's name for it


def checkpoint_files(checkpoint) -> list[str]:
    """The files a checkpoint is made of: the file itself, the shards its index names, or a folder's single weights
    file or index (safetensors first: reading it cannot run code)."""
    path = os.fspath(checkpoint)
    if os.path.isfile(path):
        return _shards_of(path) if path.endswith(".json") else [path]
    if not os.path.isdir(path):
        raise HpcError(f"checkpoint {path} does not exist",
                       fix="pass a weights file, a shard index (.index.json) or the folder holding them")
    names = set(os.listdir(path))
    for single in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
        if single in names:
            return [os.path.join(path, single)]
    for index in (SAFE_INDEX_NAME, INDEX_NAME):
        if index in names:
            return _shards_of(os.path.join(path, index))
    indexes = sorted(n for n in names if n.endswith(".index.json"))
    if len(indexes) == 1:
        return _shards_of(os.path.join(path, indexes[0]))
    if indexes:
        raise HpcError(f"checkpoint folder {path} holds several shard indexes ({', '.join(indexes)})",
                       fix="pass the index to load, or remove the others")
    raise HpcError(f"checkpoint folder {path} holds no {SAFE_WEIGHTS_NAME}, {WEIGHTS_NAME} or shard index "
                   "(*.index.json)", fix="pass the folder save_pretrained or save_model wrote, or the weights file")


def _shards_of(index_file: str) -> list[str]:
    try:
        with open(index_file, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise HpcError(f"shard index {index_file} cannot be read: {e}", fix="save the checkpoint again") from None
    weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise HpcError(f"shard index {index_file} has no weight_map of tensor name to shard file",
                       fix="pass the index save_pretrained wrote (model.safetensors.index.json)")
    folder = os.path.dirname(index_file)
    shards = sorted(set(weight_map.values()))
    outside = [s for s in shards if os.path.isabs(s) or os.path.normpath(s).startswith("..")]
    if outside:
        raise HpcError(f"shard index {index_file} names files outside its folder ({outside[0]})",
                       fix="an index names its shards by file name; rewrite it or save the checkpoint again")
    missing = [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
    if missing:
        raise HpcError(f"shard index {index_file} names {len(missing)} shard(s) missing from {folder}: "
                       f"{', '.join(missing[:3])}", fix="copy every shard the index names, or save the checkpoint "
                                                        "again")
    return [os.path.join(folder, s) for s in shards]


def load_torch_file(path) -> dict:
    """A torch-format state dict, memory-mapped (tensors are read when used) with ``weights_only=True``: a file
    that needs more than tensors and plain containers is refused unless the user opted in (safe_load)."""
    return safe_load.load(path, map_location="cpu", mmap=True)


def _check_safetensors_format(path: str, metadata: dict | None) -> None:
    framework = (metadata or {}).get("format", "pt")
    if framework not in ("pt", "np", "mlx"):
        raise HpcError(f"{path} was saved by {framework} (its tensors are laid out for it, not for torch)",
                       fix="convert the checkpoint to PyTorch where it was made")


def iter_checkpoint_tensors(checkpoint_file) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of one checkpoint file, each read when reached."""
    path = os.fspath(checkpoint_file)
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt", device="cpu") as f:
            _check_safetensors_format(path, f.metadata())
            for name in f.keys():
                yield name, f.get_tensor(name)
        return
    state = load_torch_file(path)
    if not isinstance(state, dict):
        raise HpcError(f"{path} holds a {type(state).__name__}, not a state dict",
                       fix="save model.state_dict(), not the model")
    if "state_dict" in state and isinstance(state["state_dict"], dict) and not any(
            isinstance(v, torch.Tensor) for v in state.values()):
        state = state["state_dict"]  # a training checkpoint that wraps the weights
    for name in list(state):
        value = state.pop(name)  # dropped from the dict as it is handed out: the caller decides what it keeps
        if isinstance(value, torch.Tensor):
            yield name, value


def load_state_dict(checkpoint_file, device_map: dict | None = None) -> dict:
    """One checkpoint file's tensors as a dict on the host (Accelerate's; loading into a model streams instead)."""
    del device_map  # tensors are placed by whoever sets them into the model
    return dict(iter_checkpoint_tensors(checkpoint_file))


def _mapped_device(name: str, device_map: dict):
    prefix = name
    while prefix not in device_map:
        if not prefix:
            raise HpcError(f"device_map gives no device for {name}", fix="add its module to the map, or use "
                                                                         "device_map='auto'")
        prefix = prefix.rpartition(".")[0]
    return device_map[prefix]


def _target_dtype(name: str, tensor: torch.Tensor, dtype, keep_in_fp32_modules) -> torch.dtype | None:
    if dtype is None or not tensor.dtype.is_floating_point:
        return None
    if keep_in_fp32_modules and dtype in (torch.float16, torch.bfloat16):
        for module in keep_in_fp32_modules:
            if name == module or name.startswith(module + ".") or f".{module}." in f".{name}":
                return torch.float32
    return dtype


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor if dtype is None else tensor.to(dtype)


def _tied_copy_loaded(model: nn.Module, name: str, tied_of: dict, loaded: set[str], device, dtype) -> bool:
    """Whether ``name`` is tied to a tensor already loaded onto ``device`` in the dtype this one would get: then
    this copy adds nothing but memory, and ``name`` is tied to that tensor now. A checkpoint that stores a tied
    weight twice stores it equal; if not, the first one read wins (Accelerate keeps the sorted-first name's)."""
    group = tied_of.get(name)
    if group is None or device == "disk":
        return False
    done = [other for other in group if other != name and other in loaded]
    if not done:
        return False
    keeper = get_tensor(model, done[0])
    if not same_device(device, keeper.device) or (dtype is not None and keeper.dtype != dtype):
        return False  # offloaded (on meta, its data on disk), on another device, in another dtype: its own copy
    owner, leaf = owner_of(model, name)
    owner._parameters[leaf] = keeper  # tie now: retie_parameters would, after the copy had been made
    return True


def load_checkpoint_in_model(model: nn.Module, checkpoint, device_map: dict | None = None, offload_folder=None,
                             dtype=None, offload_state_dict: bool = False, offload_buffers: bool = False,
                             keep_in_fp32_modules: list[str] | None = None, offload_8bit_bnb: bool = False,
                             strict: bool = False, full_state_dict: bool = True,
                             broadcast_from_rank0: bool = False) -> None:
    """Fill ``model`` (which may be on meta) from ``checkpoint``, each tensor onto its device in ``device_map``
    (default: where the model's tensor is, the host for meta); "disk" tensors are written to ``offload_folder`` and
    left on meta for ``dispatch_model``. ``dtype`` casts floating tensors (``keep_in_fp32_modules`` stay float32);
    ``strict`` refuses a checkpoint whose names differ from the model's."""
    del full_state_dict  # tensors are always read whole: there is no sharded (DTensor) model to fill here
    if offload_8bit_bnb:
        raise HpcError("offload_8bit_bnb (bitsandbytes 8-bit offload) is not supported by hpc",
                       fix="load the model with transformers' quantization, or without offload_8bit_bnb")
    if broadcast_from_rank0:
        raise HpcError("broadcast_from_rank0 is not supported by hpc's loader",
                       fix="load the checkpoint on every rank (each reads it memory-mapped)")
    dtype = as_dtype(dtype)
    tied = find_tied_parameters(model)
    if not tied and check_tied_parameters_in_config(model):
        logger.warning("the config ties weights but the model's are not tied: call model.tie_weights() first")
    to_disk = device_map is not None and "disk" in device_map.values()
    if device_map is not None:
        check_devices_available(device_map)
        check_tied_parameters_on_same_device(tied, device_map)
    if to_disk:
        if offload_folder is None:
            raise HpcError("device_map puts some modules on 'disk' but no offload_folder was given",
                           fix="pass offload_folder=<a folder with room for them>, or give the GPUs and 'cpu' more "
                               "max_memory")
        os.makedirs(offload_folder, exist_ok=True)
    files = checkpoint_files(checkpoint)

    model_keys = set(model.state_dict())
    buffers = {name for name, _ in model.named_buffers()}
    loaded: set[str] = set()
    unexpected: list[str] = []
    offload_index: dict = {}
    host_folder = tempfile.mkdtemp(prefix="hpc-host-offload-") if offload_state_dict else None
    host_index: dict = {}
    tied_of = {name: group for group in tied for name in group}
    try:
        for file in files:
            for name, tensor in iter_checkpoint_tensors(file):
                if name not in model_keys:
                    unexpected.append(name)
                    continue
                new_dtype = _target_dtype(name, tensor, dtype, keep_in_fp32_modules)
                if device_map is None:
                    current = get_tensor(model, name).device
                    device = "cpu" if current.type == "meta" else current
                else:
                    device = _mapped_device(name, device_map)
                if _tied_copy_loaded(model, name, tied_of, loaded, device, new_dtype):
                    # the checkpoint stores a tied weight under two names: a second copy on the device would
                    # only live until retie_parameters keeps one (a whole embedding of extra peak)
                    loaded.add(name)
                    del tensor
                    continue
                loaded.add(name)
                if device == "disk" and (offload_buffers or name not in buffers):
                    set_module_tensor_to_device(model, name, "meta", dtype=new_dtype)
                    offload_weight(_cast(tensor, new_dtype), name, offload_folder, index=offload_index)
                elif device == "disk":
                    # a buffer that is not offloaded waits on the host; the hook moves it to the execution device
                    set_module_tensor_to_device(model, name, "cpu", value=tensor, dtype=new_dtype)
                elif device == "cpu" and host_folder is not None:
                    set_module_tensor_to_device(model, name, "meta", dtype=new_dtype)
                    offload_weight(_cast(tensor, new_dtype), name, host_folder, index=host_index)
                else:
                    # cast where the tensor is read, then one copy to its device: the device never holds the
                    # checkpoint's dtype beside the model's (the cast is made once, not here and again inside)
                    set_module_tensor_to_device(model, name, device, value=tensor, dtype=new_dtype)
                del tensor
        save_offload_index(offload_index, offload_folder)
        if host_folder is not None:
            load_offloaded_weights(model, host_index, host_folder)
    finally:
        if host_folder is not None:
            shutil.rmtree(host_folder, ignore_errors=True)

    covered = set(loaded)
    for group in tied:  # a checkpoint stores a tied weight once, under any one of its names
        if covered.intersection(group):
            covered.update(group)
    missing = sorted(model_keys - covered)
    if strict and (missing or unexpected):
        raise HpcError(f"checkpoint {checkpoint} does not match {type(model).__name__}: "
                       f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected "
                       f"(e.g. {unexpected[:3]})", fix="load the checkpoint saved from this model, or strict=False")
    if unexpected:
        logger.warning("%d tensor(s) of %s are not in %s and were skipped, e.g. %s", len(unexpected), checkpoint,
                       type(model).__name__, unexpected[:3])
    if missing:
        logger.warning("%d tensor(s) of %s are not in %s and keep their current values, e.g. %s", len(missing),
                       type(model).__name__, checkpoint, missing[:3])
    retie_parameters(model, tied)
