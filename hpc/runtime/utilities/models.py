"""`accelerate.utils.other` and the model helpers of `accelerate.utils.modeling`: unwrap a prepared model, compile
its repeated blocks, save and load on the main process, and the small facts scripts ask of a model."""

from __future__ import annotations

import collections
import logging
import platform
import re
import socket
import sys
from functools import partial

import torch
from packaging.version import Version

from hpc.runtime.big_models.module_tensors import id_tensor_storage
from hpc.runtime.process.distributed_type import DistributedType

logger = logging.getLogger(__name__)


def _optimized_module():
    # nothing is compiled until torch.compile imported dynamo, whose import alone takes seconds: not done to ask
    if "torch._dynamo" not in sys.modules:
        return None
    return torch._dynamo.eval_frame.OptimizedModule


def is_compiled_module(module) -> bool:
    """Whether ``module`` is what torch.compile returned (an OptimizedModule around the model)."""
    optimized = _optimized_module()
    return optimized is not None and isinstance(module, optimized)


def has_compiled_regions(module) -> bool:
    """Whether some submodule of ``module`` was compiled (compile_regions' result)."""
    optimized = _optimized_module()
    return optimized is not None and bool(module._modules) and any(isinstance(m, optimized) for m in module.modules())


def _repeated_blocks(module) -> bool:
    # a ModuleList of one class: the transformer's layers, worth compiling once and reusing the compiled code
    return isinstance(module, torch.nn.ModuleList) and len(module) > 0 and \
        all(isinstance(m, module[0].__class__) for m in module)


def _has_repeated_blocks(module) -> bool:
    return any(_repeated_blocks(m) for m in module.modules())


def compile_regions(module, **compile_kwargs):
    """A copy of ``module`` whose repeated blocks are compiled one by one (they hit the compiler's cache after
    the first) and whose other leaves are compiled whole: a shorter cold start than torch.compile(model)."""
    def compiled(node):
        if _repeated_blocks(node):
            return torch.nn.ModuleList([torch.compile(block, **compile_kwargs) for block in node])
        if _has_repeated_blocks(node):
            copy = node.__class__.__new__(node.__class__)
            copy.__dict__.update(node.__dict__)
            copy._modules = collections.OrderedDict(
                (name, compiled(child)) for name, child in node._modules.items())
            return copy
        return torch.compile(node, **compile_kwargs)

    new = compiled(module)
    if "_orig_mod" not in new.__dict__:
        new.__dict__["_orig_mod"] = module  # what extract_model_from_parallel gives back
    return new


def _compile_in_place(module, **compile_kwargs):
    if _repeated_blocks(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif _has_repeated_blocks(module):
        for child in module.children():
            _compile_in_place(child, **compile_kwargs)
    else:
        module.compile(**compile_kwargs)
    return module


def compile_regions_deepspeed(module, **compile_kwargs) -> None:
    """compile_regions in place (module.compile()): a DeepSpeed engine's hooks stay on the call path."""
    _compile_in_place(module, **compile_kwargs)


def compile_regions_fsdp2(module, **compile_kwargs):
    """compile_regions in place: fully_shard's forward hooks, added after, still run (torch.compile's wrapper
    would bypass them)."""
    return _compile_in_place(module, **compile_kwargs)


def model_has_dtensor(model) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def get_model_tp_size(model) -> int | None:
    """The tensor-parallel degree a transformers model was sharded with (its tp_size, or its config's
    distributed_config in transformers 5), None if it was not."""
    if getattr(model, "tp_size", None) is not None:
        return model.tp_size
    config = getattr(getattr(model, "config", None), "distributed_config", None)
    return config.get("tp_size") if isinstance(config, dict) else getattr(config, "tp_size", None)


def _wrapper_types() -> tuple:
    # a wrapper exists only once its module was imported: not imported here just to ask (FSDP's takes seconds)
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    if "torch.distributed.fsdp" in sys.modules:
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrappers += (FullyShardedDataParallel,)
    if "deepspeed" in sys.modules:
        from deepspeed import DeepSpeedEngine

        wrappers += (DeepSpeedEngine,)
    return wrappers


def extract_model_from_parallel(model, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True,
                                recursive: bool = False):
    """The user's model out of what prepare() wrapped it in (DDP, FSDP1, a DeepSpeed engine; FSDP2 shards in
    place). ``keep_fp32_wrapper=False`` takes off the autocast forward mixed precision put on it;
    ``keep_torch_compile=False`` returns the model inside torch.compile's wrapper; ``recursive`` also unwraps
    ``.module`` wrappers among the children."""
    compiled = None
    if is_compiled_module(model):
        compiled, model = model, model._orig_mod
    elif has_compiled_regions(model) and "_orig_mod" in model.__dict__:
        compiled, model = model, model.__dict__["_orig_mod"]
    wrappers = _wrapper_types()
    while isinstance(model, wrappers):
        model = model.module
    if recursive:
        def unwrap(module):
            inner = unwrap(module.module) if hasattr(module, "module") else module
            for name, child in inner.named_children():
                setattr(inner, name, unwrap(child))
            return inner

        model = unwrap(model)
    if not keep_fp32_wrapper:
        forward = model.__dict__.get("forward")
        if getattr(forward, "hpc_autocast", False):
            del model.forward  # the class's own forward again
    if keep_torch_compile and compiled is not None:
        if is_compiled_module(compiled):
            compiled._orig_mod = model
        else:
            compiled.__dict__["_orig_mod"] = model
        return compiled
    return model


def clean_state_dict_for_safetensors(state_dict: dict) -> dict:
    """Tensors that share storage (tied weights) kept once, with a warning naming those dropped (safetensors
    refuses shared storage); every tensor made contiguous."""
    by_storage = collections.defaultdict(list)
    for name, tensor in state_dict.items():
        if not isinstance(tensor, str):
            by_storage[id_tensor_storage(tensor)].append(name)
    dropped = [name for names in by_storage.values() if len(names) > 1 for name in names[1:]]
    for name in dropped:
        del state_dict[name]
    if dropped:
        logger.warning(f"Removed shared tensor {set(dropped)} while saving. This should be OK, but check by "
                       "verifying that you don't receive any warning while reloading")
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state_dict.items()}


def save(obj, f, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """torch.save (or safetensors) on the main process only, or on each node's main process."""
    from hpc.runtime.process.state import PartialState

    if safe_serialization:
        from safetensors.torch import save_file

        writer = partial(save_file, metadata={"format": "pt"})
        if isinstance(obj, collections.OrderedDict):
            obj = clean_state_dict_for_safetensors(obj)
    else:
        writer = torch.save
    state = PartialState()
    if (state.is_local_main_process if save_on_each_node else state.is_main_process):
        writer(obj, f)


def load(f, map_location=None, **kwargs):
    """torch.load with weights_only=True unless the caller says otherwise (numpy arrays and RNG states allowed):
    a file another user could write runs no code."""
    import numpy as np

    kwargs.setdefault("weights_only", True)
    if not kwargs["weights_only"]:
        return torch.load(f, map_location=map_location, **kwargs)
    allowed = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(f, map_location=map_location, **kwargs)


def get_pretty_name(obj) -> str:
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or str(obj)


def merge_dicts(source: dict, destination: dict) -> dict:
    """``source`` merged into ``destination`` (in place, nested dicts merged key by key)."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def is_port_in_use(port: int | None = None) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", port or 29500)) == 0


def convert_bytes(size) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def check_os_kernel() -> None:
    """Warns on Linux kernels older than 5.5, where distributed jobs are known to hang."""
    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found and Version(found.group()) < Version("5.5.0"):
        logger.warning(f"Detected kernel version {found.group()}, which is below the recommended minimum of "
                       "5.5.0; this can cause the process to hang. Upgrade the kernel.")


def get_module_children_bottom_up(model, return_fqns: bool = False) -> list:
    """Every module of ``model``, children before parents, ``model`` last (with names when ``return_fqns``)."""
    stack, ordered = [("", model)], []
    while stack:
        name, module = stack.pop()
        stack.extend((f"{name}.{child}" if name else child, sub) for child, sub in module.named_children())
        ordered.append((name, module) if return_fqns else module)
    return ordered[::-1]


def is_peft_model(model) -> bool:
    """Whether ``model`` is a peft PeftModel (peft installed and the model one of its wrappers)."""
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        return False
    from peft import PeftModel

    return isinstance(extract_model_from_parallel(model), PeftModel)


def get_mixed_precision_context_manager(native_amp: bool = False, autocast_kwargs=None):
    """torch.autocast for the job's mixed precision (fp16 or bf16 on the job's device), or a no-op when there is
    none or ``native_amp`` is False."""
    import contextlib

    from hpc.runtime.process.state import AcceleratorState, PartialState, is_initialized

    if not native_amp:
        return contextlib.nullcontext()
    state = PartialState()
    mode = AcceleratorState().mixed_precision if is_initialized() else "no"
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}.get(mode)
    if dtype is None:
        return contextlib.nullcontext()
    extra = {}
    if autocast_kwargs is not None:
        extra = {"enabled": autocast_kwargs.enabled}
        if autocast_kwargs.cache_enabled is not None:
            extra["cache_enabled"] = autocast_kwargs.cache_enabled
    return torch.autocast(state.device.type, dtype=dtype, **extra)


def get_grad_scaler(distributed_type: DistributedType | None = None, **kwargs):
    """The fp16 loss scaler for the job's device; FSDP's agrees on skipped steps across its shards."""
    from hpc.runtime.process.state import PartialState

    device = PartialState().device.type
    if distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device, **kwargs)
    return torch.amp.GradScaler(device, **kwargs)
