"""`accelerate.utils.fsdp_utils`: an FSDP model's and optimizer's state in Accelerate's file layout (what scripts
that call these directly, and Accelerate's own FSDP tests, write and read), and the FSDP2 helpers around
prepare(). hpc's FSDP is FSDP2 (fully_shard): the state goes through torch.distributed.checkpoint's state_dict
API, whole (FULL_STATE_DICT) or as DCP shards (SHARDED_STATE_DICT). Nothing is unpickled on load."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch

from hpc.errors import HpcError
from hpc.runtime.utilities.constants import FSDP_MODEL_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME

logger = logging.getLogger(__name__)
OPTIMIZER_NAME = "optimizer"


def enable_fsdp_ram_efficient_loading() -> None:
    """transformers' from_pretrained then loads the weights on rank 0 only (the others build on meta);
    prepare() broadcasts them (FSDP plugin's sync_module_states)."""
    if "ACCELERATE_USE_FSDP" not in os.environ:
        os.environ["ACCELERATE_USE_FSDP"] = "True"
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "True"


def disable_fsdp_ram_efficient_loading() -> None:
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "False"


def _kind(fsdp_plugin) -> str:
    kind = getattr(fsdp_plugin.state_dict_type, "name", str(fsdp_plugin.state_dict_type)).upper()
    kind = kind.rsplit(".", 1)[-1]
    if kind not in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        raise HpcError(f"state_dict_type={kind} is FSDP1's (a per-rank local state): hpc's FSDP is FSDP2",
                       fix="use FULL_STATE_DICT or SHARDED_STATE_DICT")
    return kind


def _options(fsdp_plugin, full: bool, num_processes: int):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, cpu_offload=full and num_processes > 1)


def _model_state(model, adapter_only: bool, options):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if adapter_only:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(model, state_dict=get_model_state_dict(model, options=options))
    return get_model_state_dict(model, options=options)


def save_fsdp_model(fsdp_plugin, accelerator, model, output_dir, model_index: int = 0, adapter_only: bool = False,
                    use_dcp: bool = True) -> None:
    """FULL_STATE_DICT: ``pytorch_model_fsdp[_i].bin`` written by rank 0; SHARDED_STATE_DICT: a DCP folder
    ``pytorch_model_fsdp_<i>`` (or per-rank ``..._rank<r>.bin`` files with ``use_dcp=False``)."""
    os.makedirs(output_dir, exist_ok=True)
    full = _kind(fsdp_plugin) == "FULL_STATE_DICT"
    state = _model_state(model, adapter_only, _options(fsdp_plugin, full, accelerator.num_processes))
    if full:
        name = f"{FSDP_MODEL_NAME}.bin" if model_index == 0 else f"{FSDP_MODEL_NAME}_{model_index}.bin"
        if accelerator.process_index == 0:
            torch.save(state, os.path.join(output_dir, name))
    elif use_dcp:
        import torch.distributed.checkpoint as dcp

        folder = os.path.join(output_dir, f"{FSDP_MODEL_NAME}_{model_index}")
        os.makedirs(folder, exist_ok=True)
        dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(folder))
    else:
        name = f"{FSDP_MODEL_NAME}_{model_index}_rank{accelerator.process_index}.bin"
        torch.save(state, os.path.join(output_dir, name))


def _dcp_load(state: dict, folder: str) -> None:
    import torch.distributed.checkpoint as dcp

    from hpc.runtime.checkpoint import dcp_safe

    planner = dcp_safe.SafeLoadPlanner()
    dcp_safe.loading(Path(folder), lambda: dcp.load(state, storage_reader=dcp_safe.SafeReader(folder),
                                                    planner=planner), planner)


def load_fsdp_model(fsdp_plugin, accelerator, model, input_dir, model_index: int = 0, adapter_only: bool = False,
                    use_dcp: bool = True):
    """What save_fsdp_model wrote, into ``model`` (prepared); returns set_model_state_dict's key report."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    from hpc.runtime.checkpoint import safe_load

    accelerator.wait_for_everyone()
    full = _kind(fsdp_plugin) == "FULL_STATE_DICT"
    options = _options(fsdp_plugin, full, accelerator.num_processes)
    if full:
        name = f"{FSDP_MODEL_NAME}.bin" if model_index == 0 else f"{FSDP_MODEL_NAME}_{model_index}.bin"
        state = safe_load.load(os.path.join(input_dir, name), map_location="cpu")
    elif use_dcp:
        folder = input_dir if f"{FSDP_MODEL_NAME}" in str(input_dir) else \
            os.path.join(input_dir, f"{FSDP_MODEL_NAME}_{model_index}")
        state = _model_state(model, adapter_only, options)
        holder = {"model": state}
        _dcp_load(holder, folder)
        state = holder["model"]
    else:
        name = f"{FSDP_MODEL_NAME}_{model_index}_rank{accelerator.process_index}.bin"
        state = safe_load.load(os.path.join(input_dir, name), map_location="cpu")
    if adapter_only:
        from peft import set_peft_model_state_dict

        return set_peft_model_state_dict(model, state)
    return set_model_state_dict(model, state, options=options)


def save_fsdp_optimizer(fsdp_plugin, accelerator, optimizer, model, output_dir, optimizer_index: int = 0,
                        use_dcp: bool = True) -> None:
    """FULL_STATE_DICT: ``optimizer[_i].bin`` by rank 0; SHARDED_STATE_DICT: a DCP folder ``optimizer_<i>``."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    os.makedirs(output_dir, exist_ok=True)
    full = _kind(fsdp_plugin) == "FULL_STATE_DICT"
    inner = getattr(optimizer, "optimizer", optimizer)
    state = get_optimizer_state_dict(model, inner, options=_options(fsdp_plugin, full, accelerator.num_processes))
    if full:
        name = f"{OPTIMIZER_NAME}.bin" if optimizer_index == 0 else f"{OPTIMIZER_NAME}_{optimizer_index}.bin"
        if accelerator.process_index == 0:
            torch.save(state, os.path.join(output_dir, name))
    else:
        import torch.distributed.checkpoint as dcp

        folder = os.path.join(output_dir, f"{OPTIMIZER_NAME}_{optimizer_index}")
        os.makedirs(folder, exist_ok=True)
        dcp.save({"optimizer": state}, storage_writer=dcp.FileSystemWriter(folder))


def load_fsdp_optimizer(fsdp_plugin, accelerator, optimizer, model, input_dir, optimizer_index: int = 0,
                        adapter_only: bool = False, use_dcp: bool = True) -> None:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    from hpc.runtime.checkpoint import safe_load

    accelerator.wait_for_everyone()
    full = _kind(fsdp_plugin) == "FULL_STATE_DICT"
    options = _options(fsdp_plugin, full, accelerator.num_processes)
    inner = getattr(optimizer, "optimizer", optimizer)
    if full:
        name = f"{OPTIMIZER_NAME}.bin" if optimizer_index == 0 else f"{OPTIMIZER_NAME}_{optimizer_index}.bin"
        state = safe_load.load(os.path.join(input_dir, name), map_location="cpu")
    else:
        folder = input_dir if OPTIMIZER_NAME in Path(input_dir).name else \
            os.path.join(input_dir, f"{OPTIMIZER_NAME}_{optimizer_index}")
        holder = {"optimizer": get_optimizer_state_dict(model, inner, options=options)}
        _dcp_load(holder, folder)
        state = holder["optimizer"]
    set_optimizer_state_dict(model, inner, state, options=options)


def merge_fsdp_weights(checkpoint_dir, output_path, safe_serialization: bool = True,
                       remove_checkpoint_dir: bool = False) -> None:
    """A DCP folder (SHARDED_STATE_DICT's ``pytorch_model_fsdp_0`` or ``optimizer_0``) as one file,
    ``output_path/model.safetensors`` (or ``pytorch_model.bin``), written by the main process; any number of
    shards, read on the CPU, nothing unpickled."""
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from hpc.runtime.checkpoint import dcp_safe
    from hpc.runtime.process.state import PartialState
    from hpc.runtime.utilities.models import save

    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / ".metadata").is_file():
        hint = [name for name in (f"{FSDP_MODEL_NAME}_0", f"{OPTIMIZER_NAME}_0") if (checkpoint_dir / name).exists()]
        raise ValueError(f"Tried to load from {checkpoint_dir} but couldn't find a valid metadata file."
                         + (f" Pass {' or '.join(str(checkpoint_dir / h) for h in hint)} instead." if hint else ""))
    state = PartialState()
    if state.is_main_process:
        class Planner(dcp_safe.SafeBytes, _EmptyStateDictLoadPlanner):
            pass

        merged: dict = {}
        planner = Planner()
        dcp_safe.loading(checkpoint_dir, lambda: _load_state_dict(
            merged, storage_reader=dcp_safe.SafeReader(str(checkpoint_dir)), planner=planner, no_dist=True),
            planner)
        if len(merged) == 1:  # {"model": {...}} as save_fsdp_model writes it
            merged = next(iter(merged.values()))
        out = Path(output_path)
        out.mkdir(parents=True, exist_ok=True)
        save(merged, out / (SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME),
             safe_serialization=safe_serialization)
        if remove_checkpoint_dir:
            shutil.rmtree(checkpoint_dir)
    state.wait_for_everyone()


def ensure_weights_retied(param_init_fn, model, device):
    """A parameter-init function that re-ties the model's tied weights after materializing them (materializing a
    meta model unties them); ``param_init_fn`` as it is when nothing is tied."""
    tied = getattr(model, "_tied_weights_keys", None)
    if not tied:
        return param_init_fn
    shared = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(param), []).append(name)
    groups = [names for names in shared.values() if len(names) > 1]

    def init(module):
        out = param_init_fn(module)
        for names in groups:
            first = model.get_parameter(names[0])
            for other in names[1:]:
                owner, _, attr = other.rpartition(".")
                setattr(model.get_submodule(owner) if owner else model, attr, first)
        return out

    return init


def fsdp2_load_full_state_dict(accelerator, model, full_sd: dict, cpu_offload: bool = False):
    """A whole state dict (held by rank 0; the others' may be empty) into an FSDP2 model: sharded out from rank 0
    to every rank's DTensors."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=cpu_offload)
    set_model_state_dict(model, full_sd, options=options)
    return model


def fsdp2_switch_optimizer_parameters(optimizer, mapping: dict) -> None:
    """An optimizer built on the model's parameters before fully_shard made to step the sharded ones:
    ``mapping`` is {old data_ptr: new parameter}."""
    try:
        for group in optimizer.param_groups:
            group["params"] = [mapping[p.data_ptr()] for p in group["params"]]
    except KeyError as missing:
        raise KeyError("A parameter in the optimizer couldn't be switched to its sharded version. This breaks the "
                       "training. Please raise an issue on GitHub.") from missing


def fsdp2_canonicalize_names(named_params: dict) -> dict:
    """Parameter names without torch.compile's and activation checkpointing's prefixes."""
    strip = ("_checkpoint_wrapped_module.", "_orig_mod.")
    out = {}
    for name, param in named_params.items():
        for prefix in strip:
            name = name.replace(prefix, "")
        out[name] = param
    return out


def fsdp2_apply_ac(accelerator, model):
    """Activation checkpointing on each of the model's transformer blocks (the FSDP plugin's layer classes, or
    the model's _no_split_modules)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    plugin = accelerator.state.fsdp_plugin
    names = set(getattr(plugin, "transformer_cls_names_to_wrap", None) or
                getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise HpcError("fsdp2_apply_ac: no layer class to checkpoint",
                       fix="set the FSDP plugin's transformer_cls_names_to_wrap")
    apply_activation_checkpointing(model, check_fn=lambda m: type(m).__name__ in names)
    return model


def fsdp2_prepare_model(accelerator, model):
    """The model sharded with fully_shard as prepare() shards it under FSDP (the plugin's wrap policy, mixed
    precision, activation checkpointing): prepare_model of an Accelerator configured for FSDP."""
    if not accelerator.is_fsdp2:
        raise HpcError("fsdp2_prepare_model needs an Accelerator configured for FSDP",
                       fix="pass fsdp_plugin=FullyShardedDataParallelPlugin() (or launch with --use_fsdp)")
    return accelerator.prepare_model(model)


def get_fsdp2_grad_scaler(**kwargs):
    """The fp16 loss scaler for sharded models: the found-inf check is agreed over the shards."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(**kwargs)
