"""Running a model spread over devices: ``dispatch_model`` hooks each block of a device map onto its device (or
offloads it to the host or disk, brought in for its forward only), and the shortcuts built on it: ``cpu_offload``,
``disk_offload``, ``cpu_offload_with_hook`` and ``load_checkpoint_and_dispatch``.
"""

from __future__ import annotations

import functools
import logging
import os

import torch
from torch import nn

from hpc.errors import HpcError
from hpc.runtime.big_models.device_map import (
    check_device_map,
    check_devices_available,
    get_balanced_memory,
    infer_auto_device_map,
)
from hpc.runtime.big_models.hooks import (
    AlignDevicesHook,
    CpuOffload,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from hpc.runtime.big_models.loading import load_checkpoint_in_model
from hpc.runtime.big_models.module_tensors import get_tensor
from hpc.runtime.big_models.offload import (
    INDEX_NAME,
    OffloadedWeightsLoader,
    TiedWeightsMap,
    extract_submodules_state_dict,
    offload_state_dict,
)
from hpc.runtime.big_models.sizes import find_tied_parameters, retie_parameters

logger = logging.getLogger(__name__)

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _first_device(model: nn.Module):
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def _has_offload_index(folder) -> bool:
    return folder is not None and os.path.isfile(os.path.join(folder, INDEX_NAME))


def cpu_offload(model: nn.Module, execution_device=None, offload_buffers: bool = False, state_dict: dict | None = None,
                preload_module_classes: list[str] | None = None) -> nn.Module:
    """Keep one copy of the weights on the host (``state_dict``, default the model's); each submodule's are put
    on ``execution_device`` (default: where the model is) for its forward only."""
    if execution_device is None:
        execution_device = _first_device(model)
    check_devices_available({"": execution_device})
    if state_dict is None:
        state_dict = {name: tensor.to("cpu") for name, tensor in model.state_dict().items()}
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(model, execution_device=execution_device, offload=True, offload_buffers=offload_buffers,
                             weights_map=state_dict, preload_module_classes=preload_module_classes)
    return model


def cpu_offload_with_hook(model: nn.Module, execution_device=None,
                          prev_module_hook: UserCpuOffloadHook | None = None) -> tuple[nn.Module, UserCpuOffloadHook]:
    """The model waits on the host and moves whole to ``execution_device`` at its first forward, staying there
    until the returned hook's ``offload()``; ``prev_module_hook``'s model is offloaded when this one runs."""
    if execution_device is not None:
        check_devices_available({"": execution_device})
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(model: nn.Module, offload_dir, execution_device=None, offload_buffers: bool = False,
                 preload_module_classes: list[str] | None = None) -> nn.Module:
    """Write the weights to ``offload_dir`` (unless it already holds an offload index) and map each submodule's
    from there for its forward only: between forwards the model holds no weights at all."""
    if execution_device is None:
        execution_device = _first_device(model)
    check_devices_available({"": execution_device})
    if not _has_offload_index(offload_dir):
        offload_state_dict(offload_dir, model.state_dict())
    weights = TiedWeightsMap(OffloadedWeightsLoader(save_folder=offload_dir), find_tied_parameters(model))
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(model, execution_device=execution_device, offload=True, offload_buffers=offload_buffers,
                             weights_map=weights, preload_module_classes=preload_module_classes)
    return model


def _main_device(devices: list):
    """The device offloaded blocks run on: the first accelerator in the map (lowest index first), else the host."""
    accelerators = [d for d in devices if d not in ("cpu", "disk")]
    if not accelerators:
        return "cpu"
    indices = sorted(d for d in accelerators if isinstance(d, int))
    return indices[0] if indices else accelerators[0]


def _refuse_moves(model: nn.Module) -> None:
    """A dispatched model's tensors are placed by its hooks: ``model.to(...)`` would scatter meta placeholders."""

    def guard(method):
        @functools.wraps(method)
        def guarded(*args, **kwargs):
            if any(p.device.type == "meta" for p in model.parameters()):
                raise HpcError(f"this {type(model).__name__} is dispatched with offloaded modules, which it holds "
                               "on meta between forwards: it cannot be moved",
                               fix="dispatch it again with another device_map, or remove_hook_from_submodules(model) "
                                   "and load it whole")
            if method.__name__ != "to" or torch._C._nn._parse_to(*args, **kwargs)[0] is not None:  # not dtype only
                logger.warning("moving a model dispatched with hooks: its hooks still send inputs to the mapped "
                               "devices")
            return method(*args, **kwargs)

        return guarded

    model.to = guard(model.to)
    model.cuda = guard(model.cuda)


def dispatch_model(model: nn.Module, device_map: dict, main_device=None, state_dict: dict | None = None,
                   offload_dir=None, offload_index: dict | None = None, offload_buffers: bool = False,
                   skip_keys=None, preload_module_classes: list[str] | None = None,
                   force_hooks: bool = False) -> nn.Module:
    """Spread ``model`` over ``device_map`` ({module name: GPU index, "cpu", torch device or "disk"}): blocks on a
    device are placed there; blocks on "cpu" (when a GPU runs the model) or "disk" are offloaded and brought to
    ``main_device`` for their forward. One device and no ``force_hooks``: the model is simply moved there."""
    check_device_map(model, device_map)
    check_devices_available(device_map)
    devices = list(dict.fromkeys(device_map.values()))
    if len(devices) > 1 or "disk" in devices or force_hooks:
        if main_device is None:
            main_device = _main_device(devices)
        if main_device != "cpu" and state_dict is None:
            on_host = [name for name, device in device_map.items() if device == "cpu"]
            if on_host:
                state_dict = extract_submodules_state_dict(model.state_dict(), on_host)
        on_disk = [name for name, device in device_map.items() if device == "disk"]
        if on_disk and offload_dir is None and offload_index is None:
            raise HpcError(f"device_map puts {', '.join(on_disk[:3])} on 'disk' but no offload folder was given",
                           fix="pass offload_dir=<a folder with room for them> (offload_folder= when loading)")
        if on_disk and offload_index is None and not _has_offload_index(offload_dir):
            offload_state_dict(offload_dir, extract_submodules_state_dict(model.state_dict(), on_disk))

        execution_device = {name: main_device if device in ("cpu", "disk") else device
                            for name, device in device_map.items()}
        execution_device[""] = main_device
        offloaded = ("disk",) if str(main_device) in ("cpu", "mps") else ("cpu", "disk")
        offload = {name: device in offloaded for name, device in device_map.items()}
        folder = offload_dir if on_disk else None
        tied = find_tied_parameters(model)
        weights_map = None
        if state_dict is not None or folder is not None or offload_index is not None:
            loader = OffloadedWeightsLoader(state_dict=state_dict, save_folder=folder, index=offload_index,
                                            device=main_device if offload_index is not None else None)
            weights_map = TiedWeightsMap(loader, tied)
        # tied weights on a device share one copy there: keyed by the host tensor's address
        tied_params_map = {}
        for group in tied:
            for name in group:
                param = get_tensor(model, name)
                if param.device.type != "meta":
                    tied_params_map[param.data_ptr()] = {}
        attach_align_device_hook_on_blocks(model, execution_device=execution_device, offload=offload,
                                           weights_map=weights_map, offload_buffers=offload_buffers,
                                           skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                                           tied_params_map=tied_params_map)
        retie_parameters(model, tied)  # the hooks replaced parameters one name at a time
        _refuse_moves(model)
    else:
        model.to(devices[0])
    model.hf_device_map = dict(device_map)
    return model


def load_checkpoint_and_dispatch(model: nn.Module, checkpoint, device_map=None, max_memory: dict | None = None,
                                 no_split_module_classes: list[str] | None = None, offload_folder=None,
                                 offload_buffers: bool = False, dtype=None, offload_state_dict: bool | None = None,
                                 skip_keys=None, preload_module_classes: list[str] | None = None,
                                 force_hooks: bool = False, strict: bool = False, full_state_dict: bool = True,
                                 broadcast_from_rank0: bool = False) -> nn.Module:
    """Load ``checkpoint`` into ``model`` (built under ``init_empty_weights``) and dispatch it: ``device_map`` is a
    map, or "auto"/"balanced" (spread evenly over the GPUs), "balanced_low_0" (GPU 0 kept light for generate),
    "sequential" (fill GPUs in order), computed within ``max_memory``; None loads without dispatching."""
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise HpcError(f"device_map={device_map!r} is not a strategy",
                           fix=f"use one of {', '.join(DEVICE_MAP_STRATEGIES)}, or a dict of module name to device")
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory=max_memory,
                                             no_split_module_classes=no_split_module_classes, dtype=dtype,
                                             low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, max_memory=max_memory,
                                           no_split_module_classes=no_split_module_classes, dtype=dtype,
                                           offload_buffers=offload_buffers)
        if "disk" in device_map.values() and offload_folder is None:
            on_disk = [name for name, device in device_map.items() if device == "disk"]
            raise HpcError(f"the model does not fit in max_memory: {', '.join(on_disk[:3])} would go to disk, and no "
                           "offload_folder was given", fix="pass offload_folder=<a folder with room for them>, or "
                                                           "raise max_memory")
    # With disk in the map, the host part waits on disk too until the disk part is written, as Accelerate's default:
    # measured (scripts/bench/big_model_load.py), it lowers the load's peak host memory by ~20% for a write and a read
    if offload_state_dict is None:
        offload_state_dict = isinstance(device_map, dict) and "disk" in device_map.values()
    load_checkpoint_in_model(model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype,
                             offload_state_dict=bool(offload_state_dict), offload_buffers=offload_buffers,
                             strict=strict, full_state_dict=full_state_dict, broadcast_from_rank0=broadcast_from_rank0)
    if device_map is None:
        return model
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder, offload_buffers=offload_buffers,
                          skip_keys=skip_keys, preload_module_classes=preload_module_classes, force_hooks=force_hooks)
