"""A module's tensors by dotted name: listing them, and putting one on a device (or on meta) in place.

``param.to(device)`` makes a new tensor the module does not hold; these helpers replace the module's own entry,
keeping a Parameter's class and ``requires_grad``, which is what every hook and loader here needs.
"""

from __future__ import annotations

import torch
from torch import nn

from hpc.errors import HpcError


def as_device(device) -> torch.device:
    """``0`` and ``"cuda:0"`` as Accelerate's device maps write them, as a torch.device (an int is a CUDA index)."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def same_device(first, second) -> bool:
    """Whether two devices are one (``cuda`` and ``cuda:0`` are)."""
    first, second = as_device(first), as_device(second)
    if first.type != second.type:
        return False
    return (first.index or 0) == (second.index or 0) if first.type != "cpu" else True


def check_device_same(first_device, second_device) -> bool:
    """Whether two devices are one, an accelerator without an index being its device 0 (``cuda`` is ``cuda:0``,
    which ``torch.device`` equality denies)."""
    return same_device(first_device, second_device)


def recursive_getattr(obj, attr: str):
    """``getattr`` along a dotted path: ``recursive_getattr(model, "h.0.attn.weight")``."""
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def owner_of(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    """The submodule that holds ``tensor_name`` ("h.0.attn.weight") and the tensor's own name in it."""
    *path, leaf = tensor_name.split(".")
    for part in path:
        child = getattr(module, part, None)
        if not isinstance(child, nn.Module):
            raise HpcError(f"{type(module).__name__} has no submodule {part!r} (looking for {tensor_name!r})",
                           fix="check the name against model.state_dict().keys()")
        module = child
    return module, leaf


def get_tensor(module: nn.Module, tensor_name: str) -> torch.Tensor:
    owner, leaf = owner_of(module, tensor_name)
    return getattr(owner, leaf)


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers ``state_dict`` leaves out (never in a checkpoint, so never offloaded)."""
    found = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, sub in module.named_modules():
            found |= {f"{prefix}.{b}" if fqns and prefix else b for b in sub._non_persistent_buffers_set}
    return found


def named_module_tensors(module: nn.Module, include_buffers: bool = True, recurse: bool = False,
                         remove_non_persistent: bool = False):
    """(name, tensor) for the module's parameters, then its buffers: its direct ones, or all with ``recurse``."""
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skipped = set()
    if remove_non_persistent:
        skipped = {name for name, _ in module.named_buffers(recurse=recurse)
                   if _is_non_persistent(module, name)}
    for name, buffer in module.named_buffers(recurse=recurse):
        if name not in skipped:
            yield name, buffer


def _is_non_persistent(module: nn.Module, name: str) -> bool:
    owner, leaf = owner_of(module, name)
    return leaf in owner._non_persistent_buffers_set


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """(device, storage address, storage bytes): equal for tensors sharing memory (meta tensors all share 0)."""
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.device, 0, tensor.nelement() * tensor.element_size()


def _is_integral(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)


def set_module_tensor_to_device(module: nn.Module, tensor_name: str, device, value: torch.Tensor | None = None,
                                dtype=None, fp16_statistics=None, tied_params_map: dict | None = None,
                                non_blocking: bool = False, clear_cache: bool = True) -> None:
    """Put the module's tensor ``tensor_name`` on ``device``, from ``value`` when given (cast to ``dtype``, else
    to the dtype the module holds; integers and booleans keep theirs). ``tied_params_map`` ({data_ptr: {device:
    tensor}}) lets tied weights share one copy per device instead of one each."""
    del fp16_statistics, clear_cache  # Accelerate's bitsandbytes and cache knobs: nothing here needs them
    owner, name = owner_of(module, tensor_name)
    if name not in owner._parameters and name not in owner._buffers:
        raise HpcError(f"{type(owner).__name__} has no parameter or buffer {name!r} ({tensor_name!r})",
                       fix="check the name against model.state_dict().keys()")
    is_buffer = name in owner._buffers
    old = getattr(owner, name)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""))

    if tied_params_map is not None:
        for source in (value, old):
            if source is not None and source.device.type != "meta":
                shared = tied_params_map.get(source.data_ptr(), {})
                if device in shared:
                    owner._parameters[name] = shared[device]
                    return
    if old.device.type == "meta" and value is None and as_device(device).type != "meta":
        raise HpcError(f"{tensor_name} is on the meta device (no data) and no value was given to put on {device}",
                       fix="load the checkpoint first (load_checkpoint_in_model) or build the model outside "
                           "init_empty_weights")

    if value is not None:
        if old.shape != value.shape:
            raise HpcError(f"{tensor_name}: the value has shape {tuple(value.shape)}, the model's tensor "
                           f"{tuple(old.shape)}", fix="the checkpoint does not match this model's config")
        if dtype is None:
            value = value.to(old.dtype, non_blocking=non_blocking)
        elif not _is_integral(value.dtype):
            value = value.to(dtype, non_blocking=non_blocking)

    with torch.no_grad():
        if value is None:
            new = old.to(device, non_blocking=non_blocking)
            if dtype is not None and as_device(device).type == "meta" and not _is_integral(old.dtype):
                new = new.to(dtype)
        else:
            new = value.to(device, non_blocking=non_blocking)
        if is_buffer:
            owner._buffers[name] = new
        elif value is not None or not same_device(device, old.device) or new.dtype != old.dtype:
            param = owner._parameters[name]
            attributes = dict(param.__dict__)
            hf_initialized = attributes.pop("_is_hf_initialized", None)
            new = type(param)(new, requires_grad=old.requires_grad)
            if hf_initialized is not None:
                new._is_hf_initialized = hf_initialized
            owner._parameters[name] = new

    if tied_params_map is not None:
        for source in (old, value):
            if source is not None and source.device.type != "meta" and source.data_ptr() in tied_params_map:
                tied_params_map[source.data_ptr()].setdefault(device, new)
                break
