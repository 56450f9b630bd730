"""Accelerate's big-model inference under hpc's paths (hpc.runtime.big_models): empty init, sizes and device maps,
hooks, CPU and disk offload, checkpoint loading (single file, shards with an index, torch files read with
weights_only) and dispatch, on tiny models in process. Every dispatched model must give the plain model's outputs
exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from hpc.errors import HpcError
from hpc.runtime.big_models import offload as offload_module

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DIM = 8


class Block(nn.Module):
    """A residual block: must never be split over devices."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Tiny(nn.Module):
    """Embedding, four blocks, a norm with buffers, and a head tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, DIM)
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.norm = nn.BatchNorm1d(DIM)
        self.head = nn.Linear(DIM, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x.transpose(1, 2)).transpose(1, 2))


def tiny(seed=0) -> Tiny:
    torch.manual_seed(seed)
    model = Tiny().eval()
    with torch.no_grad():  # buffers that are not the defaults, so a lost buffer shows in the output
        model.norm.running_mean.uniform_(-1, 1)
        model.norm.running_var.uniform_(0.5, 2)
    return model


IDS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
# embed+head (tied), 4 blocks of 2*8*16+16+8 = 280 floats, norm
MAP_CPU_DISK = {"embed": "cpu", "head": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk",
                "blocks.3": "cpu", "norm": "disk"}


def empty_tiny():
    from hpc import init_empty_weights

    with init_empty_weights():
        return Tiny().eval()


def save_safetensors(model, path):
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}  # tied: stored once
    save_file(state, str(path), metadata={"format": "pt"})


# names and paths

def test_accelerates_names_import_from_hpcs_paths():
    # `import hpc` staying torch-free with these names in its table: tests/unit/test_accelerate_names.py
    import hpc.utils
    from hpc import (  # noqa: F401
        cpu_offload,
        cpu_offload_with_hook,
        disk_offload,
        dispatch_model,
        infer_auto_device_map,
        init_empty_weights,
        init_on_device,
        load_checkpoint_and_dispatch,
        load_checkpoint_in_model,
    )
    from hpc.big_modeling import init_empty_weights as e2
    from hpc.big_modeling import load_checkpoint_and_dispatch as l2
    from hpc.hooks import (  # noqa: F401
        AlignDevicesHook,
        CpuOffload,
        ModelHook,
        SequentialHook,
        UserCpuOffloadHook,
        add_hook_to_module,
        attach_align_device_hook,
        attach_align_device_hook_on_blocks,
        remove_hook_from_module,
        remove_hook_from_submodules,
    )
    from hpc.utils import (  # noqa: F401
        OffloadedWeightsLoader,
        align_module_device,
        compute_module_sizes,
        find_tied_parameters,
        get_balanced_memory,
        has_offloaded_params,
        offload_state_dict,
    )
    from hpc.utils import infer_auto_device_map as i2
    from hpc.utils import load_checkpoint_in_model as lc2
    from hpc.utils.modeling import convert_file_size_to_int, get_max_memory, set_module_tensor_to_device  # noqa: F401
    from hpc.utils.offload import PrefixedDataset, load_offloaded_weight, offload_weight  # noqa: F401

    assert e2 is init_empty_weights and l2 is load_checkpoint_and_dispatch and i2 is infer_auto_device_map
    assert lc2 is load_checkpoint_in_model and set(hpc.utils.__all__) <= set(dir(hpc.utils))


# Accelerate 1.15's own public names in its big-model modules (recorded from its source: the names each module
# defines, and the helpers scripts import from them); hpc's path must have every one
ACCELERATE_NAMES = {
    "big_modeling": ["attach_layerwise_casting_hooks", "cpu_offload", "cpu_offload_with_hook", "disk_offload",
                     "dispatch_model", "init_empty_weights", "init_on_device", "load_checkpoint_and_dispatch",
                     "LayerwiseCastingHook", "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING", "AlignDevicesHook",
                     "CpuOffload", "UserCpuOffloadHook", "add_hook_to_module", "attach_align_device_hook",
                     "attach_align_device_hook_on_blocks", "OffloadedWeightsLoader", "check_device_map",
                     "extract_submodules_state_dict", "find_tied_parameters", "get_balanced_memory",
                     "infer_auto_device_map", "load_checkpoint_in_model", "offload_state_dict", "retie_parameters",
                     "recursive_getattr"],
    "hooks": ["AlignDevicesHook", "CpuOffload", "LayerwiseCastingHook", "ModelHook", "SequentialHook",
              "UserCpuOffloadHook", "add_hook_to_module", "attach_align_device_hook",
              "attach_align_device_hook_on_blocks", "attach_execution_device_hook", "remove_hook_from_module",
              "remove_hook_from_submodules", "PartialState", "PrefixedDataset", "clear_device_cache", "find_device",
              "get_non_persistent_buffers", "named_module_tensors", "recursive_getattr", "send_to_device",
              "set_module_tensor_to_device"],
    # get_grad_scaler, get_mixed_precision_context_manager and is_peft_model live there too: training names,
    # not big-model ones (hpc's mixed precision is hpc.runtime.precision)
    "utils.modeling": ["align_module_device", "calculate_maximum_sizes", "check_device_map", "check_device_same",
                       "check_tied_parameters_in_config", "check_tied_parameters_on_same_device", "clean_device_map",
                       "compute_module_sizes", "compute_module_total_buffer_size", "convert_file_size_to_int",
                       "dtype_byte_size", "fallback_allocate", "find_tied_parameters", "get_balanced_memory",
                       "get_max_layer_size", "get_max_memory", "get_module_leaves", "get_module_size_with_ties",
                       "get_non_persistent_buffers", "get_state_dict_from_offload", "get_state_dict_offloaded_model",
                       "has_offloaded_params", "id_tensor_storage", "infer_auto_device_map", "load_checkpoint_in_model",
                       "load_offloaded_weights", "load_state_dict", "named_module_tensors", "retie_parameters",
                       "set_module_tensor_to_device", "CustomDtype", "SAFE_WEIGHTS_NAME", "WEIGHTS_INDEX_NAME",
                       "WEIGHTS_NAME", "clear_device_cache", "load_offloaded_weight", "offload_weight",
                       "save_offload_index"],
    "utils.offload": ["OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict",
                      "load_offloaded_weight", "offload_state_dict", "offload_weight", "save_offload_index"],
    # the big-model names `from accelerate.utils import ...` finds
    "utils": ["CustomDtype", "OffloadedWeightsLoader", "PrefixedDataset", "SAFE_WEIGHTS_NAME", "WEIGHTS_INDEX_NAME",
              "WEIGHTS_NAME", "align_module_device", "calculate_maximum_sizes", "check_device_map",
              "check_tied_parameters_in_config", "check_tied_parameters_on_same_device", "compute_module_sizes",
              "convert_file_size_to_int", "dtype_byte_size", "extract_submodules_state_dict", "find_device",
              "find_tied_parameters", "get_balanced_memory", "get_max_layer_size", "get_max_memory",
              "has_offloaded_params", "id_tensor_storage", "infer_auto_device_map", "load_checkpoint_in_model",
              "load_offloaded_weight", "load_offloaded_weights", "load_state_dict", "named_module_tensors",
              "offload_state_dict", "offload_weight", "recursive_getattr", "retie_parameters", "save_offload_index",
              "send_to_device", "set_module_tensor_to_device"],
}


def test_every_big_model_name_of_accelerate_is_at_hpcs_path():
    import importlib

    missing = [f"hpc.{module}.{name}" for module, names in ACCELERATE_NAMES.items()
               for name in names if not hasattr(importlib.import_module(f"hpc.{module}"), name)]
    assert not missing
    import hpc.big_modeling
    import hpc.hooks
    import hpc.utils.modeling

    for module in (hpc.big_modeling, hpc.hooks, hpc.utils.modeling):
        assert set(module.__all__) <= set(dir(module))


# empty init

def test_init_empty_weights_puts_parameters_on_meta_and_restores_torch():
    from hpc import init_empty_weights, init_on_device

    original = nn.Module.register_parameter
    with init_empty_weights():
        model = nn.Sequential(nn.Linear(10_000, 10_000), nn.BatchNorm1d(4))
    assert nn.Module.register_parameter is original
    assert model[0].weight.device.type == "meta" and isinstance(model[0].weight, nn.Parameter)
    assert model[1].running_mean.device.type == "cpu"  # buffers only with include_buffers
    with init_empty_weights(include_buffers=True):
        with_buffers = nn.BatchNorm1d(4)
    assert with_buffers.running_mean.device.type == "meta" and with_buffers.weight.device.type == "meta"
    with init_on_device("cpu"):
        on_cpu = nn.Linear(2, 2)
    assert on_cpu.weight.device.type == "cpu" and nn.Linear(2, 2).weight.device.type == "cpu"


# sizes, tied weights, max_memory

def test_sizes_tied_parameters_and_memory_strings():
    from hpc.utils import compute_module_sizes, convert_file_size_to_int, find_tied_parameters, get_max_memory

    model = tiny()
    sizes = compute_module_sizes(model)
    assert sizes["blocks.0"] == (2 * DIM * DIM + 2 * DIM + 2 * DIM * DIM + DIM) * 4
    assert sizes[""] == sum(t.numel() * 4 for n, t in model.state_dict().items()
                            if n not in ("head.weight", "norm.num_batches_tracked")) + 8
    assert compute_module_sizes(model, dtype=torch.float16)["blocks.0"] == sizes["blocks.0"] // 2
    assert compute_module_sizes(model, special_dtypes={"blocks.0.up.weight": "float16"})["blocks.0.up.weight"] == \
        2 * DIM * DIM * 2
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]
    assert convert_file_size_to_int("10GiB") == 10 * 2**30
    assert convert_file_size_to_int("500MB") == 500 * 10**6 and convert_file_size_to_int("8Gb") == 10**9
    assert list(get_max_memory({"disk": "1GB", "cpu": 100, 1: "2KiB", 0: 5})) == [0, 1, "cpu", "disk"]
    assert get_max_memory({"cpu": "1KiB"}) == {"cpu": 1024}
    with pytest.raises(HpcError, match="not a memory size"):
        convert_file_size_to_int("ten gigs")
    with pytest.raises(HpcError, match="not GPU indices"):
        get_max_memory({"cuda:0": "1GB"})
    assert set(get_max_memory()) >= {"cpu"}


# device maps

def _bytes_per_device(model, device_map):
    from hpc.utils import compute_module_sizes

    sizes = compute_module_sizes(model)
    used: dict = {}
    for name, device in device_map.items():
        used[device] = used.get(device, 0) + sizes[name]
    return used, sizes


def test_infer_auto_device_map_respects_memory_no_split_and_ties():
    from hpc import infer_auto_device_map

    model = empty_tiny()  # shapes only
    _, sizes = _bytes_per_device(model, {})
    block = sizes["blocks.0"]
    # GPU indices fill first (the code path of a GPU machine: nothing here touches a GPU), then cpu, then disk
    budget = {0: sizes["embed"] + block + 64, 1: block * 2 + block + 8, "cpu": 2 * block}
    with pytest.warns(UserWarning, match="buffers need 72 bytes"):  # the norm's, offloaded: Accelerate warns too
        device_map = infer_auto_device_map(model, max_memory=budget, no_split_module_classes=["Block"])
    used, _ = _bytes_per_device(model, device_map)
    # the first GPU keeps room for the largest layer it may have to run: its budget minus that layer is the bound
    assert used.get(0, 0) <= budget[0] - block and all(used.get(d, 0) <= budget[d] for d in (1, "cpu"))
    assert list(dict.fromkeys(device_map.values())) == [d for d in (0, 1, "cpu", "disk") if d in used]
    assert device_map["embed"] == device_map["head"]  # tied weights travel together
    for name in device_map:
        assert not name.startswith("blocks.") or name.count(".") == 1, device_map  # blocks whole
    # without no_split, a block that does not fit is split into its layers
    split = infer_auto_device_map(model, max_memory={"cpu": sizes["embed"] + block + block // 2})
    assert any(name.count(".") == 2 for name in split), split
    assert infer_auto_device_map(model, max_memory={"cpu": "1GB"}) == {"": "cpu"}


def test_balanced_memory_spreads_over_gpus():
    from hpc.utils import get_balanced_memory

    model = empty_tiny()
    total = sum(t.numel() * 4 for t in model.parameters()) + 3 * DIM * 4 + 8
    balanced = get_balanced_memory(model, max_memory={0: "1GB", 1: "1GB", "cpu": "1GB"},
                                   no_split_module_classes=["Block"])
    assert total // 2 < balanced[0] < total and balanced[1] == 10**9
    low = get_balanced_memory(model, max_memory={0: "1GB", 1: "1GB", 2: "1GB"}, low_zero=True)
    assert low[0] < balanced[0]
    assert get_balanced_memory(model, max_memory={"cpu": 1000}) == {"cpu": 1000}


class SizedBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up = nn.Linear(DIM, width)
        self.down = nn.Linear(width, DIM)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Ragged(nn.Module):
    """A top-level table bigger than any layer, blocks of four widths, a head that is not tied."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(48, DIM))
        self.embed = nn.Embedding(20, DIM)
        self.blocks = nn.ModuleList([SizedBlock(w) for w in (4, 16, 8, 24)])
        self.head = nn.Linear(DIM, 20)

    def forward(self, ids):
        x = self.embed(ids) + self.table[: ids.shape[-1]]
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_fallback_allocation_and_balanced_memory_equal_accelerates():
    """Recorded from Accelerate 1.15 on the same models and budgets (and 1,500 random budgets compared by hand)."""
    from hpc import init_empty_weights
    from hpc.utils import get_balanced_memory, infer_auto_device_map

    with init_empty_weights():
        model = Ragged()
    budget = {0: 2488, "cpu": 8}
    assert infer_auto_device_map(model, max_memory=budget, no_split_module_classes=["SizedBlock"]) == {"": "disk"}
    # GPU 0 cannot take the table with room for the largest layer; rather than stay empty it takes what fits
    assert list(infer_auto_device_map(model, max_memory=budget, no_split_module_classes=["SizedBlock"],
                                      fallback_allocation=True).items()) == [
        ("embed", 0), ("table", "disk"), ("blocks", "disk"), ("head", "disk")]
    # the margin is the first SizedBlock's size (304 bytes), as Accelerate measures it, not the largest one's
    three = {0: 3000, 1: 3000, 2: 3000}
    assert get_balanced_memory(model, max_memory=three, no_split_module_classes=["SizedBlock"]) == \
        {0: 2813, 1: 2813, 2: 3000}
    assert get_balanced_memory(model, max_memory=three, no_split_module_classes=["SizedBlock"], low_zero=True) == \
        {0: 560, 1: 3000, 2: 3000}
    # a budget with "disk" is balanced too (Accelerate's fails on it: torch.device("disk"))
    assert get_balanced_memory(model, max_memory={**three, "disk": 10})["disk"] == 10


def test_fallback_allocate_and_sizes_with_ties_equal_accelerates():
    from hpc.runtime.big_models.sizes import top_level_entries
    from hpc.utils import compute_module_sizes, find_tied_parameters
    from hpc.utils.modeling import fallback_allocate, get_module_leaves, get_module_size_with_ties

    model = empty_tiny()
    sizes = compute_module_sizes(model)
    entries = top_level_entries(model)
    tied = find_tied_parameters(model)

    def first_fit(limit, no_split):
        name, _, rest = fallback_allocate(list(entries), sizes, limit, no_split, tied)
        return name, [n for n, _ in rest]

    # breadth-first into splittable modules; the found one's ancestors are replaced by their parts
    assert first_fit(700, ["Block"]) == ("embed", ["blocks", "norm", "head"])
    assert first_fit(200, None) == ("norm", ["embed", "blocks", "head"])
    assert first_fit(560, None) == ("blocks.0.down", ["embed", "blocks.0.up", "blocks.1", "blocks.2", "blocks.3",
                                                      "norm", "head"])
    assert first_fit(600, None) == ("blocks.0.up", ["embed", "blocks.0.down", "blocks.1", "blocks.2", "blocks.3",
                                                    "norm", "head"])
    assert fallback_allocate(list(entries), sizes, -1, None, tied)[0] is None  # nothing fits, or not a size:
    assert fallback_allocate(list(entries), sizes, "lots", None, tied) == (None, None, entries)  # as it came
    # the head holds the embedding's tied weight: it goes with it, at no extra size
    assert get_module_size_with_ties(["head.weight"], sizes["embed"], sizes, entries[1:])[:2] == (640, ["head"])
    assert get_module_leaves(sizes)[:3] == ["embed.weight", "blocks.0.up.weight", "blocks.0.up.bias"]


def test_custom_dtypes_devices_and_attribute_paths():
    from hpc.utils import CustomDtype, compute_module_sizes, dtype_byte_size, recursive_getattr
    from hpc.utils.modeling import check_device_same

    model = Ragged()
    assert dtype_byte_size(CustomDtype.INT2) == 0.25 and dtype_byte_size(CustomDtype.FP8) == 1
    assert compute_module_sizes(model, dtype=CustomDtype.INT4)[""] == 820.0  # Accelerate's numbers
    assert compute_module_sizes(model, special_dtypes={"head.weight": CustomDtype.INT2})["head"] == 120.0
    same = [check_device_same(torch.device(a), torch.device(b))
            for a, b in [("cuda", "cuda:0"), ("cuda:1", "cuda"), ("cpu", "cpu"), ("cpu", "cuda")]]
    assert same == [True, False, True, False]
    assert recursive_getattr(model, "blocks.1.up.weight") is model.blocks[1].up.weight


# hooks

class AddOne(nn.Module):
    def forward(self, x, scale=1.0):
        return (x + 1) * scale


class Double(object):
    pass


def test_hooks_wrap_forward_chain_and_come_off():
    from hpc.hooks import ModelHook, SequentialHook, add_hook_to_module, remove_hook_from_module

    class Times(ModelHook):
        def __init__(self, k):
            self.k = k

        def pre_forward(self, module, x, **kwargs):
            return (x * self.k,), {**kwargs, "scale": 10.0}

        def post_forward(self, module, output):
            return output - 1

    module = AddOne()
    add_hook_to_module(module, Times(2))
    assert module(torch.tensor(1.0)).item() == (2 + 1) * 10 - 1
    add_hook_to_module(module, Times(3), append=True)
    assert isinstance(module._hf_hook, SequentialHook)
    assert module(torch.tensor(1.0)).item() == (6 + 1) * 10 - 2
    remove_hook_from_module(module)
    assert not hasattr(module, "_hf_hook") and "forward" not in module.__dict__
    assert module(torch.tensor(1.0)).item() == 2


def test_align_devices_hook_offloads_and_aligns():
    from hpc.hooks import AlignDevicesHook, add_hook_to_module, remove_hook_from_submodules
    from hpc.utils import align_module_device, has_offloaded_params

    torch.manual_seed(0)
    layer = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    expected = layer(x)
    add_hook_to_module(layer, AlignDevicesHook(execution_device="cpu", offload=True, io_same_device=True))
    assert has_offloaded_params(layer) and layer.weight.device.type == "meta"
    assert torch.equal(layer(x), expected) and layer.weight.device.type == "meta"
    with align_module_device(layer):
        assert layer.weight.device.type == "cpu"
    assert layer.weight.device.type == "meta"
    remove_hook_from_submodules(layer)
    assert layer.weight.device.type == "cpu" and torch.equal(layer(x), expected)


# dispatch, offload

def test_dispatch_cpu_and_disk_map_gives_the_same_outputs(tmp_path):
    from hpc import dispatch_model

    expected = tiny()(IDS)
    model = dispatch_model(tiny(), MAP_CPU_DISK, offload_dir=tmp_path)
    assert model.blocks[1].up.weight.device.type == "meta" and model.norm.weight.device.type == "meta"
    assert model.blocks[0].up.weight.device.type == "cpu"
    assert torch.equal(model(IDS), expected) and torch.equal(model(IDS), expected)
    assert model.hf_device_map == MAP_CPU_DISK
    assert {"index.json", "blocks.1.up.weight.dat", "norm.running_mean.dat"} <= set(os.listdir(tmp_path))
    with pytest.raises(HpcError, match="cannot be moved"):
        model.to("cpu")


def test_cpu_offload_and_disk_offload_give_the_same_outputs(tmp_path):
    from hpc import cpu_offload, cpu_offload_with_hook, disk_offload

    expected = tiny()(IDS)
    on_cpu = cpu_offload(tiny())
    assert all(p.device.type == "meta" for p in on_cpu.parameters())
    assert torch.equal(on_cpu(IDS), expected)
    on_disk = disk_offload(tiny(), tmp_path)
    assert all(p.device.type == "meta" for p in on_disk.parameters())
    assert torch.equal(on_disk(IDS), expected)

    first, hook_1 = cpu_offload_with_hook(tiny(), "cpu")
    second, hook_2 = cpu_offload_with_hook(tiny(1), "cpu", prev_module_hook=hook_1)
    assert torch.equal(first(IDS), expected) and torch.equal(second(IDS), tiny(1)(IDS))
    hook_2.offload()
    hook_2.remove()
    assert not hasattr(second, "_hf_hook")


def test_state_dict_of_an_offloaded_model_is_brought_in_module_by_module(tmp_path):
    from hpc import cpu_offload, disk_offload, dispatch_model
    from hpc.utils import has_offloaded_params
    from hpc.utils.modeling import get_state_dict_from_offload, get_state_dict_offloaded_model

    def ragged():
        torch.manual_seed(0)
        return Ragged().eval()

    for build, device_map in ((tiny, MAP_CPU_DISK), (ragged, {"table": "cpu", "embed": "disk", "blocks": "disk",
                                                               "head": "cpu"})):
        expected = build().state_dict()
        for offload in (lambda m: cpu_offload(m, "cpu"), lambda m: disk_offload(m, tmp_path / f"d{len(expected)}"),
                        lambda m: dispatch_model(m, device_map, offload_dir=tmp_path / f"m{len(expected)}")):
            model = offload(build())
            state = get_state_dict_offloaded_model(model)
            # Ragged's top-level table too (Accelerate's skips the top module's own tensors)
            assert list(state) == list(expected) and all(torch.equal(state[k], expected[k]) for k in expected)
            assert all(p.device.type == "meta" for p in model.blocks[1].parameters())  # and offloaded again
    model = cpu_offload(ragged(), "cpu")
    assert has_offloaded_params(model) and has_offloaded_params(model.blocks[0].up)  # the top one in a chain
    wanted = {"blocks.0.up.weight": None, "blocks.0.up.bias": None}
    get_state_dict_from_offload(model.blocks[0].up, "blocks.0.up.weight", wanted)
    assert torch.equal(wanted["blocks.0.up.bias"], ragged().blocks[0].up.bias) and len(wanted) == 2


def test_layerwise_casting_stores_small_and_computes_large():
    from hpc.big_modeling import attach_layerwise_casting_hooks
    from hpc.hooks import LayerwiseCastingHook

    torch.manual_seed(0)
    model = Ragged().eval()
    rounded = Ragged().eval()
    rounded.load_state_dict(model.state_dict())
    attach_layerwise_casting_hooks(model, storage_dtype=torch.bfloat16, compute_dtype=torch.float32,
                                   skip_modules_pattern="blocks.3", skip_modules_classes=(nn.Embedding,))
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert dtypes["blocks.0.up.weight"] == dtypes["head.bias"] == torch.bfloat16
    # one pattern, matched with re.search on the name; a class skipped; a bare parameter is no layer
    assert dtypes["blocks.3.up.weight"] == dtypes["embed.weight"] == dtypes["table"] == torch.float32
    assert isinstance(model.head._hf_hook, LayerwiseCastingHook) and not hasattr(model.blocks[3].up, "_hf_hook")
    with torch.no_grad():
        for name, param in rounded.named_parameters():
            if dtypes[name] == torch.bfloat16:
                param.copy_(param.bfloat16().float())
        output = model(IDS)
    assert output.dtype == torch.float32 and torch.equal(output, rounded(IDS))
    assert model.blocks[0].up.weight.dtype == torch.bfloat16  # back to storage after the forward
    with pytest.raises(HpcError, match="not a torch dtype"):
        attach_layerwise_casting_hooks(model, storage_dtype="fp8", compute_dtype=torch.float32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without GPUs")
def test_gpu_devices_fail_in_one_line_on_a_cpu_machine(tmp_path):
    from hpc import cpu_offload, cpu_offload_with_hook, dispatch_model, load_checkpoint_in_model
    from hpc.utils import check_device_map

    check_device_map(tiny(), {"": 0})  # a map for GPUs can be checked anywhere
    for call in (lambda: dispatch_model(tiny(), {"embed": 0, "head": 0, "blocks": 1, "norm": "cpu"}),
                 lambda: dispatch_model(tiny(), {"": "cuda:0"}), lambda: cpu_offload(tiny(), 0),
                 lambda: cpu_offload_with_hook(tiny(), "cuda"),
                 lambda: load_checkpoint_in_model(empty_tiny(), tmp_path, device_map={"": 0})):
        with pytest.raises(HpcError, match="which this machine does not have") as caught:
            call()
        assert caught.value.fix and "\n" not in str(caught.value)


def test_hooks_stay_out_of_compiled_graphs_without_loading_dynamo(monkeypatch):
    import sys

    from hpc.runtime.big_models.hooks import compiler_disable

    calls = []
    marked = compiler_disable(lambda x: calls.append(x) or x)
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    assert marked(1) == 1 and "torch._dynamo" not in sys.modules  # nothing compiles: dynamo is not loaded for it
    monkeypatch.undo()
    import torch._dynamo  # noqa: F401  (what torch.compile loads first)

    assert marked(2) == 2 and calls == [1, 2]


def test_disk_offload_reads_the_files_at_forward_time(tmp_path, monkeypatch):
    from hpc import load_checkpoint_and_dispatch

    save_safetensors(tiny(), tmp_path / "model.safetensors")
    expected = tiny()(IDS)
    reads = []
    real = offload_module.load_offloaded_weight
    monkeypatch.setattr(offload_module, "load_offloaded_weight", lambda f, info: reads.append(f) or real(f, info))
    model = load_checkpoint_and_dispatch(empty_tiny(), tmp_path / "model.safetensors", device_map=MAP_CPU_DISK,
                                         offload_folder=tmp_path / "offload")
    # between forwards the disk blocks hold nothing: their weights are files in the offload folder
    on_meta = {n for n, p in model.named_parameters() if p.device.type == "meta"}
    assert on_meta == {n for n, _ in model.named_parameters() if n.startswith(("blocks.1.", "blocks.2.", "norm."))}
    # the load parks the host part on disk while the disk part is written (Accelerate's default with disk in the
    # map), in a private folder of its own that is gone afterwards; the offload folder itself is not read yet
    parked = {Path(r).parent for r in reads}
    assert all(p.name.startswith("hpc-host-offload-") and not p.exists() for p in parked), parked
    reads.clear()
    assert torch.equal(model(IDS), expected)
    assert len(reads) == 4 * 2 + 2 and all(str(r).startswith(str(tmp_path / "offload")) for r in reads)
    index = json.loads((tmp_path / "offload" / "index.json").read_text())
    assert index["blocks.1.up.weight"] == {"dtype": "float32", "shape": [2 * DIM, DIM]}
    # the weights come from the file each time: zero one and the output changes
    (tmp_path / "offload" / "blocks.1.down.weight.dat").write_bytes(bytes(2 * DIM * DIM * 4))
    assert not torch.equal(model(IDS), expected)


def test_torch_format_checkpoint_is_read_memory_mapped_with_weights_only(tmp_path, monkeypatch):
    from hpc import load_checkpoint_in_model

    torch.save(tiny().state_dict(), tmp_path / "weights.pt")
    calls = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k) or real_load(*a, **k))
    model = empty_tiny()
    load_checkpoint_in_model(model, tmp_path / "weights.pt")
    assert calls and all(c.get("weights_only") is True and c.get("mmap") is True for c in calls)
    assert torch.equal(model(IDS), tiny()(IDS))


class Planted:
    """Unpickling this creates a file: the proof that code from the checkpoint ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_torch_checkpoint_with_a_planted_pickle_is_refused(tmp_path, monkeypatch):
    from hpc import load_checkpoint_in_model

    monkeypatch.delenv("HPC_TRUST_CHECKPOINT_PICKLES", raising=False)
    marker = tmp_path / "ran"
    torch.save({**tiny().state_dict(), "payload": Planted(str(marker))}, tmp_path / "pytorch_model.bin")
    with pytest.raises(HpcError, match="refused"):
        load_checkpoint_in_model(empty_tiny(), tmp_path)
    assert not marker.exists()


def _write_shards(model, folder, torch_format=False):
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}
    names = list(state)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    suffix = "bin" if torch_format else "safetensors"
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-0000{i}-of-00002.{suffix}"
        part = {k: state[k] for k in shard}
        torch.save(part, folder / file) if torch_format else save_file(part, str(folder / file))
        weight_map.update({k: file for k in shard})
    index = "pytorch_model.bin.index.json" if torch_format else "model.safetensors.index.json"
    (folder / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder / index


@pytest.mark.parametrize("torch_format", [False, True])
def test_a_sharded_folder_with_its_index_loads_and_dispatches(tmp_path, torch_format):
    from hpc import load_checkpoint_and_dispatch
    from hpc.utils import compute_module_sizes

    _write_shards(tiny(), tmp_path, torch_format)
    sizes = compute_module_sizes(empty_tiny())
    budget = {"cpu": sizes["embed"] + 2 * sizes["blocks.0"] + sizes["blocks.0"]}  # the rest goes to disk
    model = load_checkpoint_and_dispatch(empty_tiny(), tmp_path, device_map="auto", max_memory=budget,
                                         no_split_module_classes=["Block"], offload_folder=tmp_path / "offload")
    assert "disk" in model.hf_device_map.values() and "cpu" in model.hf_device_map.values()
    assert model.hf_device_map["embed"] == model.hf_device_map["head"]
    assert torch.equal(model(IDS), tiny()(IDS))


def test_dtype_and_strict_loading(tmp_path):
    from hpc import load_checkpoint_in_model

    save_safetensors(tiny(), tmp_path / "model.safetensors")
    model = empty_tiny()
    load_checkpoint_in_model(model, tmp_path, dtype="float16", keep_in_fp32_modules=["norm"])
    assert model.blocks[0].up.weight.dtype == torch.float16 and model.norm.weight.dtype == torch.float32
    assert model.head.weight is model.embed.weight
    save_file({"other.weight": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(HpcError, match="does not match"):
        load_checkpoint_in_model(empty_tiny(), tmp_path / "other.safetensors", strict=True)


# what a user can get wrong: one line each

def test_user_mistakes_are_one_line_errors(tmp_path):
    from hpc import dispatch_model, load_checkpoint_and_dispatch, load_checkpoint_in_model

    with pytest.raises(HpcError, match="not a module or tensor"):
        dispatch_model(tiny(), {**MAP_CPU_DISK, "decoder": "cpu"}, offload_dir=tmp_path)
    with pytest.raises(HpcError, match="gives no device"):
        dispatch_model(tiny(), {"embed": "cpu", "blocks": "disk"}, offload_dir=tmp_path)
    with pytest.raises(HpcError, match="does not exist"):
        load_checkpoint_in_model(empty_tiny(), tmp_path / "nowhere")
    index = _write_shards(tiny(), tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(HpcError, match="missing from"):
        load_checkpoint_in_model(empty_tiny(), index)
    save_safetensors(tiny(), tmp_path / "model.safetensors")
    with pytest.raises(HpcError, match="no offload_folder"):
        load_checkpoint_and_dispatch(empty_tiny(), tmp_path / "model.safetensors", device_map="auto",
                                     max_memory={"cpu": "1KB"})
    with pytest.raises(HpcError, match="not a strategy"):
        load_checkpoint_and_dispatch(empty_tiny(), tmp_path / "model.safetensors", device_map="fastest")
    with pytest.raises(HpcError, match="no offload folder") as caught:
        dispatch_model(tiny(), MAP_CPU_DISK)
    assert "\n" not in str(caught.value) and caught.value.fix


def test_an_offload_folder_in_accelerates_layout_is_read(tmp_path):
    """Accelerate writes each tensor with numpy.memmap (bfloat16 as int16) beside an index.json: hpc reads it."""
    np = pytest.importorskip("numpy")
    from hpc.utils import OffloadedWeightsLoader

    tensors = {"w": torch.randn(3, 4), "h": torch.randn(2, 2).bfloat16(), "s": torch.tensor(7, dtype=torch.int64)}
    index = {}
    for name, tensor in tensors.items():
        raw = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
        array = raw.numpy().reshape(-1) if raw.dim() else raw.numpy()[None]
        written = np.memmap(tmp_path / f"{name}.dat", dtype=array.dtype, mode="w+", shape=array.shape)
        written[:] = array[:]
        written.flush()
        index[name] = {"dtype": "bfloat16" if tensor.dtype == torch.bfloat16 else str(array.dtype),
                       "shape": list(tensor.shape)}
    (tmp_path / "index.json").write_text(json.dumps(index))
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    assert sorted(loader) == ["h", "s", "w"]
    assert all(torch.equal(loader[name], tensor) for name, tensor in tensors.items())


# a transformers model built from a config

@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, bos_token_id=0,
                                     eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder)
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.no_grad():
        logits = model(ids).logits
    return transformers, config, folder, ids, logits


def test_a_transformers_model_loads_and_dispatches_over_cpu_and_disk(gpt2, tmp_path):
    from hpc import init_empty_weights, load_checkpoint_and_dispatch

    transformers, config, folder, ids, logits = gpt2
    with init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    device_map = {"transformer.wte": "cpu", "lm_head": "cpu", "transformer.wpe": "cpu", "transformer.h.0": "disk",
                  "transformer.h.1": "cpu", "transformer.ln_f": "disk"}
    model = load_checkpoint_and_dispatch(model, folder, device_map=device_map, offload_folder=tmp_path,
                                         no_split_module_classes=["GPT2Block"])
    assert model.transformer.h[0].attn.c_attn.weight.device.type == "meta"
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)


def test_a_transformers_model_with_device_map_auto(gpt2, tmp_path):
    from hpc import init_empty_weights, load_checkpoint_and_dispatch
    from hpc.utils import compute_module_sizes

    transformers, config, folder, ids, logits = gpt2
    with init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    sizes = compute_module_sizes(model)
    model = load_checkpoint_and_dispatch(model, folder, device_map="auto", offload_folder=tmp_path,
                                         max_memory={"cpu": sizes["transformer.wte"] + 3 * sizes["transformer.h.0"]},
                                         no_split_module_classes=["GPT2Block"])
    assert {"cpu", "disk"} == set(model.hf_device_map.values())
    assert model.hf_device_map["transformer.wte"] == model.hf_device_map["lm_head"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)


def test_transformers_own_device_map_path_needs_the_accelerate_package(gpt2):
    """transformers' from_pretrained(device_map=...) imports `accelerate` itself (its integrations/accelerate.py):
    hpc's names do not serve it; load_checkpoint_and_dispatch above is the hpc way."""
    import importlib.util

    if importlib.util.find_spec("accelerate") is not None:
        pytest.skip("the accelerate package is installed here")
    transformers, _, folder, _, _ = gpt2
    with pytest.raises(ValueError, match="accelerate"):
        transformers.AutoModelForCausalLM.from_pretrained(folder, device_map="auto")


def test_save_model_of_an_offloaded_model_writes_the_real_weights_not_meta(tmp_path):
    """cpu_offload leaves meta tensors in the modules; save_model (and get_state_dict) take the weights from the
    offload, as Accelerate's save_model does."""
    from safetensors.torch import load_file

    from hpc import Accelerator, cpu_offload

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    want = {k: v.clone() for k, v in model.state_dict().items()}
    cpu_offload(model, execution_device="cpu")
    assert model.state_dict()["0.weight"].device.type == "meta"
    Accelerator(cpu=True).save_model(model, tmp_path)
    got = load_file(tmp_path / "model.safetensors")
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
