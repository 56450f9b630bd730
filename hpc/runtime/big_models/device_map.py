"""Where each part of a model goes: GPUs first (by index), then the host ("cpu"), then "disk".

A device map is ``{module name: device}``; a name covers everything under it. ``infer_auto_device_map`` fills the
devices in order from each one's ``max_memory``, splitting a module into its children when it does not fit (never
one whose class is in ``no_split_module_classes``: a block with a residual connection must run on one device), and
places tied parameters with the module that holds them. While anything is offloaded, the first GPU (or the host
when there is none) keeps room for the largest layer, which is brought there to run.
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict

import torch
from torch import nn

from hpc.errors import HpcError
from hpc.runtime.big_models.module_tensors import recursive_getattr
from hpc.runtime.big_models.sizes import (
    accelerator_count,
    check_tied_parameters_in_config,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
    get_module_leaves,
    top_level_entries,
)

logger = logging.getLogger(__name__)


def _no_split_list(no_split_module_classes) -> list[str]:
    if no_split_module_classes is None:
        return []
    if isinstance(no_split_module_classes, str):
        return [no_split_module_classes]
    return list(no_split_module_classes)


def _inside(name: str, prefix: str) -> bool:
    """Whether tensor or module ``name`` is ``prefix`` or under it ("h.1" is not under "h.10")."""
    return not prefix or name == prefix or name.startswith(prefix + ".")


def _splittable(item, no_split: list[str]) -> bool:
    return isinstance(item, nn.Module) and bool(list(item.named_children())) and type(item).__name__ not in no_split


def get_balanced_memory(model: nn.Module, max_memory: dict | None = None, no_split_module_classes=None, dtype=None,
                        special_dtypes: dict | None = None, low_zero: bool = False) -> dict:
    """A ``max_memory`` for ``infer_auto_device_map`` that spreads the model evenly over the GPUs instead of filling
    the first ones (``low_zero``: as little as possible on GPU 0, which ``generate`` also uses). Without GPUs it is
    ``max_memory`` as given (or what is free)."""
    user_gave_none = max_memory is None
    max_memory = get_max_memory(max_memory)
    gpus = sorted(key for key, size in max_memory.items() if isinstance(key, int) and size > 0)
    if not gpus:
        return max_memory
    if len(gpus) == 1:
        low_zero = False
        if user_gave_none:  # memory measured free now: keep a tenth for activations rather than fail mid-forward
            max_memory[gpus[0]] = int(max_memory[gpus[0]] * 0.9)
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    per_gpu = sizes[""] // (len(gpus) - 1 if low_zero else len(gpus))

    # An even share leaves each GPU a little short (layers do not cut evenly), pushing the last layers off the
    # GPUs; a margin of an unsplittable block (the first of each class, as Accelerate measures it) or of the mean
    # final module keeps them on.
    no_split = _no_split_list(no_split_module_classes)
    first_of_class: dict[str, int] = {}
    for name in sizes if no_split else ():
        if not name:
            continue
        class_name = type(recursive_getattr(model, name)).__name__
        if class_name in no_split and class_name not in first_of_class:
            first_of_class[class_name] = sizes[name]
            if len(first_of_class) == len(set(no_split)):
                break
    block = max(first_of_class.values(), default=0)
    tensors = set(get_module_leaves(sizes))
    modules_only = {n: s for n, s in sizes.items() if n not in tensors}
    final = get_module_leaves(modules_only)
    mean_final = int(sum(modules_only[n] for n in final) / max(len(final), 1))
    per_gpu += int(1.25 * max(block, mean_final))

    for index in gpus[:-1]:  # the last GPU keeps its whole budget, in case the margin was not enough
        max_memory[index] = min(max_memory[0] if low_zero and index == 0 else per_gpu, max_memory[index])
    if low_zero:
        rest = sum(max_memory[i] for i in gpus[1:])
        max_memory[0] = min(max(0, sizes[""] - rest), max_memory[0])
    return max_memory


def _tied_outside(name: str, tied_groups: list[list[str]]) -> list[str]:
    """Parameters tied to one inside ``name`` that are not inside it themselves: they must go where it goes."""
    outside = []
    for group in tied_groups:
        inside = [p for p in group if _inside(p, name)]
        if inside and len(inside) < len(group):
            outside += [p for p in group if not _inside(p, name)]
    return outside


def get_module_size_with_ties(tied_params: list[str], module_size: int, module_sizes: dict,
                              modules_to_treat: list) -> tuple[int, list[str], list]:
    """A module's size with the pending entries that hold ``tied_params`` (the parameters tied to it from outside),
    which must go where it goes: (size, their names, the entries), each holder once. A tied parameter that is
    already placed adds nothing (Accelerate raises IndexError there)."""
    names: list[str] = []
    entries: list = []
    size = module_size
    for param in tied_params:
        holder = next(((n, m) for n, m in modules_to_treat if _inside(param, n)), None)
        if holder is None:
            continue
        if holder[0] not in names:
            names.append(holder[0])
            entries.append(holder[1])
            size += module_sizes[holder[0]]
        size -= module_sizes[param]
    return size, names, entries


def _children(item, name: str) -> list:
    return top_level_entries(item, name) if isinstance(item, nn.Module) else []


def fallback_allocate(modules: list, module_sizes: dict, size_limit, no_split_module_classes=None,
                      tied_parameters: list[list[str]] | None = None) -> tuple[str | None, object, list]:
    """The first entry, searched breadth-first into the splittable ones, that fits ``size_limit`` with what is tied
    to it: (its name, it, ``modules`` without it, every ancestor of it there replaced by its parts). (None, None,
    ``modules``) when none fits or the limit is not a size."""
    try:
        limit = convert_file_size_to_int(size_limit)
    except HpcError:
        return None, None, modules
    no_split = _no_split_list(no_split_module_classes)
    tied_parameters = tied_parameters or []
    to_search = list(modules)
    found = None
    while to_search:
        name, item = to_search.pop(0)
        size, _, _ = get_module_size_with_ties(_tied_outside(name, tied_parameters), module_sizes[name],
                                               module_sizes, to_search)
        if size <= limit:
            found = (name, item)
            break
        if _splittable(item, no_split):
            to_search = _children(item, name) + to_search
    if found is None:
        return None, None, modules
    name = found[0]
    remaining = list(modules)
    parts = name.split(".")
    for depth in range(1, len(parts)):
        parent = ".".join(parts[:depth])
        at = next((i for i, (n, _) in enumerate(remaining) if n == parent), None)
        if at is not None:
            remaining = remaining[:at] + _children(remaining[at][1], parent) + remaining[at + 1:]
    at = next(i for i, (n, _) in enumerate(remaining) if n == name)
    return name, remaining.pop(at)[1], remaining


def infer_auto_device_map(model: nn.Module, max_memory: dict | None = None, no_split_module_classes=None, dtype=None,
                          special_dtypes: dict | None = None, verbose: bool = False, clean_result: bool = True,
                          offload_buffers: bool = False, fallback_allocation: bool = False) -> OrderedDict:
    """``{module name: device}`` over GPUs (ints, by index), then "cpu", then "disk", within ``max_memory``
    (default: what is free now). Tied parameters go with the module that holds them; a class in
    ``no_split_module_classes`` stays whole. With ``fallback_allocation``, a device the next module does not fit
    takes the first smaller module that does (searched breadth-first) instead of staying empty. Reads shapes only:
    the model may be on meta."""
    max_memory = get_max_memory(max_memory)
    no_split = _no_split_list(no_split_module_classes)
    devices = list(max_memory) + ([] if "disk" in max_memory else ["disk"])
    gpus = [d for d in devices if d not in ("cpu", "disk")]
    # the device offloaded layers run on keeps room for the largest of them
    keeps_room = ["mps"] if "mps" in gpus else ([gpus[0], "cpu"] if gpus else ["cpu"])
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    tied_groups = find_tied_parameters(model)
    if not tied_groups and check_tied_parameters_in_config(model):
        logger.warning("the config ties weights but the model's are not tied: call model.tie_weights() first")

    pending = top_level_entries(model)
    device_map: OrderedDict = OrderedDict()
    used = {device: 0 for device in devices}
    buffers_on: dict = {}
    needed_on_empty: dict = {}
    current = 0
    largest, largest_names = get_max_layer_size(pending, sizes, no_split)

    def say(message: str) -> None:
        if verbose:
            print(message)

    while pending:
        name, item = pending.pop(0)
        say(f"\nTreating module {name}.")
        largest_names = [n for n in largest_names if not _inside(n, name)]
        if not largest_names:
            largest, largest_names = get_max_layer_size(_modules(pending), sizes, no_split)
        size = sizes[name]
        tied = _tied_outside(name, tied_groups)
        size_with_ties, holder_names, holders = get_module_size_with_ties(tied, size, sizes, pending)

        device = devices[current]
        limit = None if device == "disk" else max_memory[device]
        reserved = 0
        if device in keeps_room:
            limit -= largest
            reserved = largest

        if limit is None or used[device] + size_with_ties <= limit:
            say(f"Putting {name}" + (f" and {holder_names}" if holder_names else f" (size={size})")
                + (f" (available={limit - used[device]})" if limit is not None else "") + f" on {device}.")
            used[device] += size_with_ties
            device_map[name] = device
            for holder in holder_names:
                pending = [(n, m) for n, m in pending if n != holder]
                device_map[holder] = device
            if not offload_buffers and isinstance(item, nn.Module):
                buffers_on[device] = buffers_on.get(device, 0) + compute_module_total_buffer_size(
                    item, dtype=dtype, special_dtypes=special_dtypes)
            continue

        if tied and used[device] + size <= limit:
            # the module fits without what it is tied to: split one of those rather than give up the device
            splittable = [(h, m) for h, m in zip(holder_names, holders) if _splittable(m, no_split)]
            if splittable:
                holder, module = splittable[0]
                say(f"Not enough space on {device} for {name} with its tied modules: splitting {holder}.")
                at = [n for n, _ in pending].index(holder)
                pending = [(name, item)] + pending[:at] + _children(module, holder) + pending[at + 1:]
                largest, largest_names = get_max_layer_size(_modules(pending), sizes, no_split)
                continue
            say("None of the tied modules can be split, going to the next device.")

        if used[device] + size >= limit and _splittable(item, no_split):
            say(f"Not enough space on {device} for {name} (available {limit - used[device]}, size {size}): "
                "splitting it.")
            pending = _children(item, name) + pending
            largest, largest_names = get_max_layer_size(_modules(pending), sizes, no_split)
            continue

        if used[device] == 0 and fallback_allocation and device != "disk":
            # nothing is on this device yet: rather than leave it empty, take the first module that fits
            room = max_memory[device] - max(largest, size_with_ties)
            found, module, rest = fallback_allocate(pending, sizes, room, no_split, tied_groups) if room >= 0 \
                else (None, None, pending)
            if module is not None:
                say(f"{name} does not fit on {device}: trying {found} there first.")
                pending = [(found, module), (name, item)] + rest
                continue

        say(f"{name} does not fit on {device} and cannot be split: going to the next device.")
        if used[device] == 0:
            needed_on_empty[device] = size_with_ties + reserved
        used[device] += reserved
        current += 1
        pending = [(name, item)] + pending

    if clean_result:
        device_map = clean_device_map(device_map)
    _warn_offloaded_buffers(max_memory, used, buffers_on, gpus, offload_buffers)
    if needed_on_empty:
        logger.info("no module could be placed on %s for lack of memory (the first one needs %s bytes with the "
                    "room kept for the largest layer); give it at least that much to use it",
                    ", ".join(map(str, needed_on_empty)), ", ".join(map(str, needed_on_empty.values())))
    return device_map


def _warn_offloaded_buffers(max_memory: dict, used: dict, buffers_on: dict, gpus: list, offload_buffers: bool) -> None:
    offloaded = buffers_on.get("cpu", 0) + buffers_on.get("disk", 0)
    if offload_buffers or not offloaded or not gpus:
        return
    if not any(max_memory[g] >= offloaded + used.get(g, 0) for g in max_memory if g not in ("cpu", "disk")):
        warnings.warn(f"the offloaded layers' buffers need {offloaded} bytes, which fit no GPU's remaining memory; "
                      "if a forward runs out of memory, offload_buffers=True moves them with the weights",
                      stacklevel=3)


def _modules(pending: list) -> list:
    return [(n, m) for n, m in pending if isinstance(m, nn.Module)]


def clean_device_map(device_map: dict, module_name: str = "") -> dict:
    """The same map with every module whose parts all go to one device written as that module once."""
    prefix = f"{module_name}." if module_name else ""
    under = [k for k in device_map if k.startswith(prefix)]
    values = [device_map[k] for k in under]
    if len(values) > 1 and len({str(v) for v in values}) == 1:
        for key in under:
            del device_map[key]
        device_map[module_name] = values[0]
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = {".".join(k.split(".")[:depth]) for k in device_map
                if k.startswith(prefix) and len(k) > len(module_name)}
    for child in sorted(children):
        clean_device_map(device_map, child)
    return device_map


def check_device_map(model: nn.Module, device_map: dict) -> None:
    """A device map must name only the model's modules or tensors and cover every tensor of its state dict."""
    known = set(dict(model.named_modules())) | set(model.state_dict()) | {n for n, _ in model.named_parameters()} \
        | {n for n, _ in model.named_buffers()}
    unknown = [key for key in device_map if key not in known]
    if unknown:
        raise HpcError(f"device_map names {unknown[:5]!r}, which {'is' if len(unknown) == 1 else 'are'} not a module "
                       f"or tensor of this {type(model).__name__}",
                       fix="use names from model.named_modules(), or device_map='auto'")
    if "" in device_map:
        return
    uncovered = [t for t in model.state_dict() if not any(_inside(t, key) for key in device_map)]
    if uncovered:
        raise HpcError(f"device_map gives no device for {len(uncovered)} tensor(s) of the model, e.g. "
                       f"{', '.join(uncovered[:3])}", fix="add their modules to the map, or use device_map='auto'")
    for device in set(device_map.values()):
        if device != "disk" and not isinstance(device, int):
            try:
                torch.device(device)
            except (RuntimeError, TypeError):
                raise HpcError(f"device_map sends modules to {device!r}, which is not a device",
                               fix="use GPU indices (0, 1, ...), 'cpu', 'disk' or torch devices") from None


def _device_available(device) -> bool:
    if isinstance(device, int):
        return 0 <= device < accelerator_count()
    try:
        kind = torch.device(device)
    except (RuntimeError, TypeError):
        return False
    if kind.type in ("cpu", "meta"):
        return True
    backend = getattr(torch, kind.type, None)
    if kind.type == "mps":
        backend = getattr(torch.backends, "mps", None)
    if backend is None or not backend.is_available():
        return False
    return not hasattr(backend, "device_count") or (kind.index or 0) < backend.device_count()


def check_devices_available(device_map: dict) -> None:
    """Every device the map names exists on this machine (GPU 0 on a CPU-only node fails here, in one line, rather
    than deep in torch when the first tensor moves)."""
    missing: dict = {}
    for name, device in device_map.items():
        if device != "disk" and not _device_available(device):
            missing.setdefault(str(device), []).append(name or "the whole model")
    if missing:
        device, names = next(iter(missing.items()))
        raise HpcError(f"device_map puts {', '.join(names[:3])} on {'GPU ' if device.isdigit() else ''}{device}, which "
                       f"this machine does not have ({accelerator_count()} GPU(s))",
                       fix="run it on a node with that device, or map those modules to 'cpu' or 'disk'")
