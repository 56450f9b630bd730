"""Hooks around a module's ``forward`` that receive its keyword arguments too (torch's forward hooks did not
always), and the hook that makes big-model inference work: ``AlignDevicesHook`` brings a module's weights (from host
memory or disk) and its inputs to the device it runs on, and sends the weights back after.

A hooked module keeps Accelerate's attributes, ``_hf_hook`` and ``_old_forward``: transformers, diffusers and peft
look for them to find where a dispatched module runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Mapping

import torch
from torch import nn

from hpc.runtime.big_models.module_tensors import (
    get_non_persistent_buffers,
    named_module_tensors,
    set_module_tensor_to_device,
)
from hpc.runtime.big_models.offload import PrefixedDataset
from hpc.runtime.process.nest import leaves, send_to_device

logger = logging.getLogger(__name__)

# what dispatch_model wraps on a dispatched model (to refuse moving it): taken off again with the hooks
ADDED_ATTRIBUTES = ("to", "cuda", "npu", "xpu", "mlu", "sdaa", "musa")


def compiler_disable(fn):
    """``fn`` kept out of ``torch.compile``'s graphs, as Accelerate keeps its hook events: moving weights in and out
    is not something to trace. Applied once dynamo is loaded (compiling loads it first): importing it only to mark
    a function costs seconds on every run that never compiles."""
    disabled = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return wrapper


class ModelHook:
    """Callbacks around a module's forward: ``pre_forward`` may change its arguments, ``post_forward`` its output.
    ``no_grad = True`` runs the forward itself under ``torch.no_grad()``."""

    no_grad = False

    def init_hook(self, module):
        """When attached; returns the module."""
        return module

    def pre_forward(self, module, *args, **kwargs):
        """Before the forward; returns (args, kwargs)."""
        return args, kwargs

    def post_forward(self, module, output):
        """After the forward; returns the output."""
        return output

    def detach_hook(self, module):
        """When removed; returns the module."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order at each event."""

    def __init__(self, *hooks):
        self.hooks = hooks

    def init_hook(self, module):
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    @compiler_disable
    def pre_forward(self, module, *args, **kwargs):
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    @compiler_disable
    def post_forward(self, module, output):
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module):
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module, *args, **kwargs):
    hook = module._hf_hook
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)
    else:
        output = module._old_forward(*args, **kwargs)
    return hook.post_forward(module, output)


def _set_forward(module: nn.Module, forward) -> None:
    # an fx GraphModule's forward lives on its generated class: an instance attribute would freeze the graph
    if "GraphModuleImpl" in str(type(module)):
        type(module).forward = forward
    else:
        module.forward = forward


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Wrap ``module.forward`` with ``hook`` (replacing a hook already there, or with ``append`` running after it,
    chained in a SequentialHook). ``remove_hook_from_module`` restores the forward."""
    if append and getattr(module, "_hf_hook", None) is not None:
        previous = module._hf_hook
        remove_hook_from_module(module)
        hook = SequentialHook(previous, hook)
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        original = module._old_forward
    else:
        original = module.forward
        module._old_forward = original
    module = hook.init_hook(module)
    module._hf_hook = hook
    _set_forward(module, functools.update_wrapper(functools.partial(_hooked_forward, module), original))
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Take off the hook ``add_hook_to_module`` put on (its ``detach_hook`` runs), restoring the forward; with
    ``recurse``, from every submodule too."""
    if hasattr(module, "_hf_hook"):
        module._hf_hook.detach_hook(module)
        delattr(module, "_hf_hook")
    if hasattr(module, "_old_forward"):
        original = module._old_forward
        if getattr(original, "__func__", None) is type(module).forward and "GraphModuleImpl" not in str(type(module)):
            module.__dict__.pop("forward", None)  # the class's own forward answers again, as before the hook
        else:
            _set_forward(module, original)
        delattr(module, "_old_forward")
    for attribute in ADDED_ATTRIBUTES:
        module.__dict__.pop(attribute, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Take every hook off the module and all its submodules."""
    remove_hook_from_module(module, recurse=True)


def find_device(data):
    """The device of the first tensor in a nest (None when it holds none)."""
    found = leaves(data, is_leaf=lambda item: isinstance(item, torch.Tensor))
    return found[0].device if found else None


class AlignDevicesHook(ModelHook):
    """Runs the module on ``execution_device``: its inputs are sent there; with ``offload`` its weights live in
    ``weights_map`` (host memory or disk) and the module holds them on meta, except during its forward;
    ``io_same_device`` returns the output where the input came from; ``place_submodules`` covers the submodules'
    tensors too (else the module's own only); ``offload_buffers`` offloads buffers with the weights."""

    def __init__(self, execution_device=None, offload: bool = False, io_same_device: bool = False,
                 weights_map: Mapping | None = None, offload_buffers: bool = False, place_submodules: bool = False,
                 skip_keys=None, tied_params_map: dict | None = None):
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device = None
        self.original_devices: dict = {}
        self.tied_params_names: set[str] = set()
        self.tied_pointers_to_remove: set = set()

    def __repr__(self):
        return (f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
                f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
                f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})")

    def _offloaded(self, module):
        return list(named_module_tensors(module, include_buffers=self.offload_buffers,
                                         recurse=self.place_submodules, remove_non_persistent=True))

    def init_hook(self, module):
        if str(self.execution_device) == "meta":  # meta tensors all have address 0: ties cannot be told apart
            self.tied_params_map = None
        if not self.offload:
            if self.execution_device is not None:
                for name, _ in list(named_module_tensors(module, recurse=self.place_submodules)):
                    set_module_tensor_to_device(module, name, self.execution_device,
                                                tied_params_map=self.tied_params_map)
            return module
        self.original_devices = {name: tensor.device
                                 for name, tensor in named_module_tensors(module, recurse=self.place_submodules)}
        if self.weights_map is None:
            self.weights_map = {name: tensor.to("cpu") for name, tensor in self._offloaded(module)}
        for name, tensor in self._offloaded(module):
            # a disk-offloaded tied weight comes back at a new address each time: remember it by name instead
            if self.tied_params_map is not None and tensor.device.type != "meta" \
                    and tensor.data_ptr() in self.tied_params_map:
                self.tied_params_names.add(name)
            set_module_tensor_to_device(module, name, "meta")
        if self.execution_device is not None:
            # buffers that are not offloaded live on the execution device for good (non-persistent ones always:
            # no checkpoint holds them, so nothing could bring them back)
            buffers = [name for name, _ in module.named_buffers(recurse=self.place_submodules)]
            if self.offload_buffers:
                non_persistent = get_non_persistent_buffers(module, recurse=self.place_submodules, fqns=True)
                buffers = [name for name in buffers if name in non_persistent]
            kept = buffers
            for name in kept:
                set_module_tensor_to_device(module, name, self.execution_device,
                                            tied_params_map=self.tied_params_map)
        return module

    @compiler_disable
    def pre_forward(self, module, *args, **kwargs):
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload:
            self.tied_pointers_to_remove = set()
            for name, _ in self._offloaded(module):
                value = self.weights_map[name]
                if self.tied_params_map is not None:
                    pointer = value.data_ptr()
                    if name in self.tied_params_names and pointer not in self.tied_params_map:
                        self.tied_params_map[pointer] = {}
                    if pointer in self.tied_params_map and self.execution_device not in self.tied_params_map[pointer]:
                        self.tied_pointers_to_remove.add((pointer, self.execution_device))
                set_module_tensor_to_device(module, name, self.execution_device, value=value,
                                            tied_params_map=self.tied_params_map)
        return (send_to_device(args, self.execution_device),
                send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys))

    @compiler_disable
    def post_forward(self, module, output):
        if self.offload:
            for name, _ in self._offloaded(module):
                set_module_tensor_to_device(module, name, "meta")
            # the device copies of tied weights this forward loaded are dropped with it, or they would stay alive
            for pointer, device in self.tied_pointers_to_remove:
                self.tied_params_map.get(pointer, {}).pop(device, None)
            self.tied_pointers_to_remove = set()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module):
        if self.offload:
            for name, device in self.original_devices.items():
                if device.type != "meta" and name in self.weights_map:
                    set_module_tensor_to_device(module, name, device, value=self.weights_map[name])
        return module


def attach_execution_device_hook(module: nn.Module, execution_device, skip_keys=None,
                                 preload_module_classes: list[str] | None = None,
                                 tied_params_map: dict | None = None) -> None:
    """An AlignDevicesHook (inputs only) on every submodule with tensors that has no hook yet, so a submodule
    called on its own still gets its inputs on its device."""
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys,
                                                    tied_params_map=tied_params_map))
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(child, execution_device, skip_keys=skip_keys,
                                     preload_module_classes=preload_module_classes, tied_params_map=tied_params_map)


def attach_align_device_hook(module: nn.Module, execution_device=None, offload: bool = False,
                             weights_map: Mapping | None = None, offload_buffers: bool = False, module_name: str = "",
                             skip_keys=None, preload_module_classes: list[str] | None = None,
                             tied_params_map: dict | None = None) -> None:
    """An AlignDevicesHook on every submodule that holds tensors directly (``weights_map`` is keyed from the top
    module; each hook sees it under its own prefix). A class in ``preload_module_classes`` loads all its
    submodules' weights at once (for modules whose children are used without being called)."""
    has_direct = next(iter(named_module_tensors(module)), None) is not None
    preload = offload and preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if has_direct or preload:
        prefixed = None
        if weights_map is not None:
            prefixed = PrefixedDataset(weights_map, f"{module_name}." if module_name else "")
        add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device, offload=offload,
                                                    weights_map=prefixed, offload_buffers=offload_buffers,
                                                    place_submodules=preload, skip_keys=skip_keys,
                                                    tied_params_map=tied_params_map), append=True)
    if preload:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(child, execution_device=execution_device, offload=offload, weights_map=weights_map,
                                 offload_buffers=offload_buffers,
                                 module_name=f"{module_name}.{child_name}" if module_name else child_name,
                                 skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                                 tied_params_map=tied_params_map)


def attach_align_device_hook_on_blocks(module: nn.Module, execution_device=None, offload=False,
                                       weights_map: Mapping | None = None, offload_buffers: bool = False,
                                       module_name: str = "", skip_keys=None,
                                       preload_module_classes: list[str] | None = None,
                                       tied_params_map: dict | None = None) -> None:
    """Hooks for a device map: ``execution_device`` and ``offload`` are one value for the whole module or
    ``{module name: value}``. A block that stays on its device gets one hook that places it whole; an offloaded
    block gets a hook on each submodule that holds weights; the top module returns outputs where inputs came from."""
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if offload:
            attach_align_device_hook(module, execution_device=execution_device, offload=True, weights_map=weights_map,
                                     offload_buffers=offload_buffers, module_name=module_name, skip_keys=skip_keys,
                                     tied_params_map=tied_params_map)
        else:
            add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device, io_same_device=True,
                                                        skip_keys=skip_keys, place_submodules=True,
                                                        tied_params_map=tied_params_map))
        return
    if not isinstance(execution_device, Mapping):
        execution_device = {key: execution_device for key in offload}
    if not isinstance(offload, Mapping):
        offload = {key: offload for key in execution_device}

    if module_name in execution_device and module_name in offload:
        device = execution_device[module_name]
        if not offload[module_name]:
            add_hook_to_module(module, AlignDevicesHook(execution_device=device, offload_buffers=offload_buffers,
                                                        io_same_device=(module_name == ""), place_submodules=True,
                                                        skip_keys=skip_keys, tied_params_map=tied_params_map))
            attach_execution_device_hook(module, device, skip_keys=skip_keys, tied_params_map=tied_params_map)
        else:
            attach_align_device_hook(module, execution_device=device, offload=True, weights_map=weights_map,
                                     offload_buffers=offload_buffers, module_name=module_name, skip_keys=skip_keys,
                                     preload_module_classes=preload_module_classes, tied_params_map=tied_params_map)
            if not hasattr(module, "_hf_hook"):
                add_hook_to_module(module, AlignDevicesHook(execution_device=device,
                                                            io_same_device=(module_name == ""), skip_keys=skip_keys,
                                                            tied_params_map=tied_params_map))
            attach_execution_device_hook(module, device, preload_module_classes=preload_module_classes,
                                         skip_keys=skip_keys, tied_params_map=tied_params_map)
    elif module_name == "":
        add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device.get(""), io_same_device=True,
                                                    skip_keys=skip_keys, tied_params_map=tied_params_map))

    for child_name, child in module.named_children():
        attach_align_device_hook_on_blocks(child, execution_device=execution_device, offload=offload,
                                           weights_map=weights_map, offload_buffers=offload_buffers,
                                           module_name=f"{module_name}.{child_name}" if module_name else child_name,
                                           skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                                           tied_params_map=tied_params_map)


def default_execution_device() -> torch.device:
    """This rank's accelerator (the one the job selected), else Apple's, else the host."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class CpuOffload(ModelHook):
    """Keeps a whole model on the host until its forward, then moves it to ``execution_device``, where it stays
    until ``init_hook`` (``UserCpuOffloadHook.offload``) sends it back; ``prev_module_hook``'s model is sent back
    first (a pipeline keeps one model at a time on the GPU)."""

    def __init__(self, execution_device=None, prev_module_hook: UserCpuOffloadHook | None = None):
        self.prev_module_hook = prev_module_hook
        self.execution_device = execution_device if execution_device is not None else default_execution_device()

    def init_hook(self, module):
        return module.to("cpu")

    @compiler_disable
    def pre_forward(self, module, *args, **kwargs):
        if isinstance(self.prev_module_hook, UserCpuOffloadHook):
            previous = next(self.prev_module_hook.model.parameters(), None)
            if previous is not None and previous.device.type != "cpu":
                self.prev_module_hook.offload()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        current = next(module.parameters(), None)
        if current is not None and current.device == torch.device(self.execution_device):
            return args, kwargs
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


class UserCpuOffloadHook:
    """What ``cpu_offload_with_hook`` returns: ``offload()`` sends the model back to the host, ``remove()`` takes
    the hook off."""

    def __init__(self, model, hook):
        self.model = model
        self.hook = hook

    def offload(self):
        self.hook.init_hook(self.model)

    def remove(self):
        remove_hook_from_module(self.model)


def _offloading_hook(module: nn.Module) -> AlignDevicesHook | None:
    """The module's AlignDevicesHook that offloads its weights, also from inside a SequentialHook (``cpu_offload``
    chains one after the top module's input hook)."""
    hook = getattr(module, "_hf_hook", None)
    for candidate in hook.hooks if isinstance(hook, SequentialHook) else (hook,):
        if isinstance(candidate, AlignDevicesHook) and candidate.offload:
            return candidate
    return None


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether the module's weights are offloaded by an AlignDevicesHook (they are on meta between forwards)."""
    return _offloading_hook(module) is not None


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device=None):
    """Inside, the module's own weights are real tensors on ``execution_device`` (default: its hook's), even when
    offloaded; after, they are where they were."""
    hook = _offloading_hook(module)
    if hook is not None:
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
    elif execution_device is not None:
        devices = {name: param.device for name, param in module.named_parameters(recurse=False)}
        try:
            for name in devices:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in devices.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield


def _state_dict_owners(model: nn.Module) -> dict[str, list[str]]:
    owners: dict[str, list[str]] = {}
    for key in model.state_dict(keep_vars=True):
        owners.setdefault(key.rpartition(".")[0], []).append(key)
    return owners


def get_state_dict_offloaded_model(model: nn.Module) -> dict:
    """The model's state dict on the host, offloaded modules included: each module's weights are brought in (from
    the host copy or the offload folder) one module at a time. Tensors still on meta with nothing to bring them in
    are left out, with a warning."""
    keys = list(model.state_dict(keep_vars=True))  # names only: meta tensors cost nothing
    owners = _state_dict_owners(model)
    found: dict = {}
    for name, module in model.named_modules(remove_duplicate=False):
        wanted = [key for key in owners.get(name, ()) if key not in found]
        if not wanted:
            continue
        with align_module_device(module, "cpu"):
            for key in wanted:
                tensor = getattr(module, key.rpartition(".")[2], None)
                if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                    found[key] = tensor.detach().to("cpu")
    placeholders = [key for key in keys if key not in found]
    if placeholders:
        logger.warning("%d tensor(s) were left out of the state dict: they are on the meta device with no offloaded "
                       "copy to bring in, e.g. %s", len(placeholders), placeholders[:3])
    return {key: found[key] for key in keys if key in found}


def get_state_dict_from_offload(module: nn.Module, module_name: str, state_dict: dict,
                                device_to_put_offload="cpu") -> dict:
    """Fill ``state_dict``'s entries for ``module`` (``module_name`` is one of its tensors' names, e.g.
    ``"h.0.attn.weight"``) from its weights, brought to ``device_to_put_offload`` when it is offloaded; entries the
    dict does not have are not added."""
    root = module_name.rpartition(".")[0]
    prefix = f"{root}." if root else ""
    with align_module_device(module, device_to_put_offload if has_offloaded_params(module) else None):
        for key, tensor in module.state_dict().items():
            if prefix + key in state_dict:
                state_dict[prefix + key] = tensor
    return state_dict
