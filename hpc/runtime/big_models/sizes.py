"""How big a model's parts are, which of its parameters are one tensor under several names, and how much memory
each device offers (``max_memory``: ``{0: "10GiB", "cpu": "30GB", "disk": ...}``).

All of it reads shapes and dtypes only, so a model built under ``init_empty_weights`` (on meta) is measured as well
as a real one.
"""

from __future__ import annotations

import enum
import inspect
import logging
import re
from collections import defaultdict

import torch
from torch import nn

from hpc.errors import HpcError
from hpc.runtime.big_models.module_tensors import get_tensor, named_module_tensors

logger = logging.getLogger(__name__)

_DECIMAL = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_BINARY = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_NAMED_DEVICES = ("mps", "cpu", "disk")  # after the GPUs (ints), in the order they are filled


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes from ``"10GiB"`` (powers of 2), ``"500MB"`` (powers of 10), ``"8Gb"`` (bits, as Accelerate reads a
    lower-case b) or an int."""
    if isinstance(size, bool):
        raise HpcError(f"{size!r} is not a memory size", fix="write e.g. '10GiB', '500MB' or a number of bytes")
    if isinstance(size, (int, float)) and size >= 0:
        return int(size)
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]i?[Bb])\s*", str(size), flags=re.IGNORECASE)
    if not match:
        raise HpcError(f"{size!r} is not a memory size", fix="write e.g. '10GiB', '500MB' or a number of bytes")
    number, unit = float(match.group(1)), match.group(2)
    if unit.upper() in _BINARY:
        return int(number * _BINARY[unit.upper()])
    value = int(number * _DECIMAL[unit.upper()])
    return value // 8 if unit.endswith("b") else value


class CustomDtype(enum.Enum):
    """Sizes torch has no dtype for, which a quantizer's ``special_dtypes``/``dtype`` may name when sizing a model."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


_CUSTOM_BYTES = {CustomDtype.FP8: 1, CustomDtype.INT4: 1 / 2, CustomDtype.INT2: 1 / 4}


def dtype_byte_size(dtype: torch.dtype) -> float:
    """Bytes per element (1/8 for bool, as Accelerate counts it; a CustomDtype's fraction)."""
    if dtype == torch.bool:
        return 1 / 8
    if isinstance(dtype, CustomDtype):
        return _CUSTOM_BYTES[dtype]
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    bits = re.search(r"[^\d](\d+)_?", str(dtype))
    if bits is None:
        raise HpcError(f"{dtype!r} is not a dtype", fix="pass a torch.dtype or its name, e.g. 'float16'")
    return int(bits.group(1)) // 8


def as_dtype(dtype) -> torch.dtype | None:
    """``"float16"``, ``"torch.float16"`` or a torch.dtype as a torch.dtype."""
    if dtype is None or isinstance(dtype, (torch.dtype, CustomDtype)):
        return dtype
    found = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(found, torch.dtype):
        raise HpcError(f"dtype={dtype!r} is not a torch dtype", fix="write e.g. 'float16', 'bfloat16' or torch.float16")
    return found


def compute_module_sizes(model: nn.Module, dtype=None, special_dtypes: dict | None = None,
                         buffers_only: bool = False) -> dict[str, int]:
    """Bytes of every submodule and tensor by name ("" is the whole model), counting each tensor at ``dtype`` when
    that is smaller (integers and booleans are never cast) and at ``special_dtypes[name]`` where given."""
    dtype = as_dtype(dtype)
    special = {name: as_dtype(d) for name, d in (special_dtypes or {}).items()}
    sizes: dict[str, int] = defaultdict(int)
    tensors = model.named_buffers(recurse=True) if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        if name in special:
            per_element = dtype_byte_size(special[name])
        elif dtype is None or tensor.dtype == torch.bool or str(tensor.dtype).startswith(("torch.uint", "torch.int")):
            per_element = dtype_byte_size(tensor.dtype)
        else:
            per_element = min(dtype_byte_size(dtype), dtype_byte_size(tensor.dtype))
        size = tensor.numel() * per_element
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            sizes[".".join(parts[:depth])] += size
    return sizes


def compute_module_total_buffer_size(model: nn.Module, dtype=None, special_dtypes: dict | None = None) -> int:
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get("", 0)


def get_max_layer_size(modules: list, module_sizes: dict, no_split_module_classes: list[str]) -> tuple[int, list]:
    """The largest layer among ``modules`` ((name, module) pairs) and the names of those that size: a layer is a
    module without children, or one whose class must not be split."""
    largest, names = 0, []
    pending = list(modules)
    while pending:
        name, module = pending.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or type(module).__name__ in no_split_module_classes:
            size = module_sizes[name]
            if size > largest:
                largest, names = size, [name]
            elif size == largest:
                names.append(name)
        else:
            pending = [(f"{name}.{child}", sub) for child, sub in children] + pending
    return largest, names


def get_module_leaves(module_sizes: dict) -> list[str]:
    """The names in ``module_sizes`` that have nothing under them (tensors, or modules without tensors below)."""
    parents = {name.rpartition(".")[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list]]:
    """(the model's bytes, (its largest layer's bytes, their names)), with transformers' ``_no_split_modules``."""
    sizes = compute_module_sizes(model)
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    return sizes[""], get_max_layer_size(top_level_entries(model), sizes, no_split)


def top_level_entries(module: nn.Module, prefix: str = "") -> list[tuple[str, object]]:
    """A module's direct parameters, children and buffers, named from ``prefix``: the units a device map places."""
    named = (list(module.named_parameters(recurse=False)) + list(module.named_children())
             + list(module.named_buffers(recurse=False)))
    return [(f"{prefix}.{name}" if prefix else name, item) for name, item in named]


def find_tied_parameters(model: nn.Module, **_ignored) -> list[list[str]]:
    """Groups of parameter names that are one tensor (a tied embedding and LM head), each group sorted, the groups
    in the order their first name comes in ``named_parameters`` (Accelerate's order)."""
    by_identity: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_identity.setdefault(id(param), []).append(name)
    return [sorted(names) for names in by_identity.values() if len(names) > 1]


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make each group one Parameter again (hooks and loading replace parameters one name at a time): the first
    member that holds data is shared by the others."""
    for group in tied_params:
        keeper = next((p for p in (get_tensor(model, name) for name in group) if p.device.type != "meta"), None)
        if keeper is None:
            continue
        for name in group:
            *path, leaf = name.split(".")
            owner = model.get_submodule(".".join(path))
            setattr(owner, leaf, keeper)


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether a transformers model's config says some of its weights are tied."""
    if "PreTrainedModel" not in [cls.__name__ for cls in inspect.getmro(type(model))]:
        return False
    config = getattr(model, "config", None)
    text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    tied_embeddings = bool(getattr(text_config, "tie_word_embeddings", False)) and \
        model.get_output_embeddings() is not None
    tied_encoder_decoder = bool(getattr(config, "is_encoder_decoder", False)) and \
        bool(getattr(config, "tie_encoder_decoder", False))
    return tied_embeddings or tied_encoder_decoder or any(hasattr(m, "_tie_weights") for m in model.modules())


def _device_of(name: str, device_map: dict):
    while name not in device_map:
        if not name:
            return None
        name = name.rpartition(".")[0]
    return device_map[name]


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: dict) -> None:
    for group in tied_params:
        devices = {name: _device_of(name, device_map) for name in group}
        if len(set(map(str, devices.values()))) > 1:
            logger.warning("tied parameters are on different devices: %s; each device holds its own copy "
                           "(device_map='auto' keeps them together)", devices)


def accelerator_count() -> int:
    """How many GPUs (CUDA, else XPU) an integer in a device map or max_memory can name here."""
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.xpu.device_count()
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _free_accelerator_memory(index: int) -> int:
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.xpu.mem_get_info(index)[0]
    return torch.cuda.mem_get_info(index)[0]


def _available_host_memory() -> int:
    import psutil

    return psutil.virtual_memory().available


def get_max_memory(max_memory: dict | None = None) -> dict:
    """``max_memory`` in bytes with its devices in filling order (GPUs by index, then "mps", "cpu", "disk"); when
    None, what each GPU and the host have free now."""
    if max_memory is None:
        found: dict = {}
        for index in range(accelerator_count()):
            try:
                found[index] = _free_accelerator_memory(index)
            except RuntimeError:  # a device another job holds exclusively: the next one may still serve
                logger.info("device %d is unavailable; trying the next", index)
        mps = getattr(torch.backends, "mps", None)
        found["mps" if mps is not None and mps.is_available() else "cpu"] = _available_host_memory()
        return found
    unknown = [key for key in max_memory if not (isinstance(key, int) and not isinstance(key, bool))
               and key not in _NAMED_DEVICES]
    if unknown:
        raise HpcError(f"max_memory names devices {unknown!r}, which are not GPU indices (0, 1, ...), 'mps', 'cpu' "
                       "or 'disk'", fix="write e.g. max_memory={0: '10GiB', 'cpu': '30GiB'}")
    gpus = sorted(key for key in max_memory if isinstance(key, int))
    count = accelerator_count()
    for index in gpus:
        if not 0 <= index < count:
            logger.warning("max_memory names GPU %d, but this machine has %d", index, count)
    ordered = gpus + [key for key in _NAMED_DEVICES if key in max_memory]
    return {key: convert_file_size_to_int(max_memory[key]) for key in ordered}
