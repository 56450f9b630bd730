"""`accelerate launch`'s flags, accepted by `hpc launch` and `hpc submit` with underscores or dashes.

Each flag is an Accelerate setting (hpc.contract.accelerate_settings translates and checks it); the table says
whether the flag takes a value, as Accelerate's argparse declares them. `hpc launch` declares them all as click
options (its --help lists them); the login-path commands take them off the command line before click parses it
(``take``): a hundred more click options cost every `hpc submit`/`render` about 7 ms.
"""

from __future__ import annotations

from typing import Any, Callable

import click

FLAG, INT, FLOAT, TEXT, MANY = "flag", int, float, str, "many"

# setting -> kind; the flags `hpc submit` already has under its own name are in SUBMIT_HAS
FLAGS: dict[str, Any] = {
    "config_file": TEXT, "cpu": FLAG, "multi_gpu": FLAG, "mixed_precision": TEXT, "num_processes": INT,
    "num_machines": INT, "num_cpu_threads_per_process": INT, "enable_cpu_affinity": FLAG,
    "dynamo_backend": TEXT, "dynamo_mode": TEXT, "dynamo_use_fullgraph": FLAG, "dynamo_use_dynamic": FLAG,
    "dynamo_use_regional_compilation": FLAG, "use_deepspeed": FLAG, "use_fsdp": FLAG,
    "use_parallelism_config": FLAG, "use_megatron_lm": FLAG, "gpu_ids": TEXT, "same_network": FLAG,
    "machine_rank": INT, "main_process_ip": TEXT, "main_process_port": INT, "tee": TEXT, "log_dir": TEXT,
    "role": TEXT, "rdzv_backend": TEXT, "rdzv_conf": TEXT, "max_restarts": INT, "monitor_interval": FLOAT,
    "no_python": FLAG, "env": MANY, "main_training_function": TEXT, "downcast_bf16": FLAG,
    "deepspeed_config_file": TEXT, "zero_stage": INT, "offload_optimizer_device": TEXT,
    "offload_param_device": TEXT, "offload_optimizer_nvme_path": TEXT, "offload_param_nvme_path": TEXT,
    "gradient_accumulation_steps": INT, "gradient_clipping": FLOAT, "zero3_init_flag": TEXT,
    "zero3_save_16bit_model": TEXT, "deepspeed_hostfile": TEXT, "deepspeed_exclusion_filter": TEXT,
    "deepspeed_inclusion_filter": TEXT, "deepspeed_multinode_launcher": TEXT, "deepspeed_moe_layer_cls_names": TEXT,
    "fsdp_version": TEXT, "fsdp_offload_params": TEXT, "fsdp_min_num_params": INT,
    "fsdp_sharding_strategy": TEXT, "fsdp_reshard_after_forward": TEXT, "fsdp_auto_wrap_policy": TEXT,
    "fsdp_transformer_layer_cls_to_wrap": TEXT, "fsdp_backward_prefetch": TEXT, "fsdp_state_dict_type": TEXT,
    "fsdp_forward_prefetch": TEXT, "fsdp_use_orig_params": TEXT, "fsdp_cpu_ram_efficient_loading": TEXT,
    "fsdp_sync_module_states": TEXT, "fsdp_activation_checkpointing": TEXT, "debug": FLAG, "quiet": FLAG,
    "mpirun_hostfile": TEXT,
    # devices and engines hpc does not run: accepted, so the error says why instead of "no such option"
    "tpu": FLAG, "tpu_cluster": FLAG, "no_tpu_cluster": FLAG, "tpu_use_sudo": FLAG, "vm": MANY,
    **{f"fp8_{name}": TEXT for name in (
        "backend", "use_autocast_during_eval", "margin", "interval", "format", "amax_history_len",
        "amax_compute_algo", "override_linear_precision", "opt_level", "enable_fsdp_float8_all_gather",
        "pad_inner_dim")},
    **{f"megatron_lm_{name}": TEXT for name in (
        "tp_degree", "pp_degree", "num_micro_batches", "sequence_parallelism", "recompute_activations",
        "use_distributed_optimizer", "gradient_clipping", "context_parallel_size", "expert_model_parallel_size",
        "expert_tensor_parallel_size", "attention_backend", "use_custom_fsdp", "use_precision_aware_optimizer",
        "optimizer_cpu_offload", "recompute_granularity", "recompute_method", "recompute_num_layers",
        "pipeline_schedule", "num_layers_per_virtual_pipeline_stage")},
    **{f"parallelism_config_{name}": TEXT for name in (
        "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "cp_comm_strategy", "sp_size",
        "sp_backend", "sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")},
}
# `accelerate launch` flags that are hpc submit's own flags too (job_options declares both spellings)
SUBMIT_HAS = {"mixed_precision", "gradient_accumulation_steps", "zero_stage", "fsdp_sharding_strategy",
              "max_restarts"}
_SETTING_OF = {"tpu": "tpu", "tpu_cluster": "tpu_use_cluster", "vm": "tpu_vm", "no_tpu_cluster": "no_tpu_cluster"}


def param(setting: str) -> str:
    return f"acc_{setting}"


CONFIG_FILE_HELP = ("An Accelerate config file (as `accelerate config` writes it); `accelerate launch`'s other flags "
                    "are accepted too (docs/launch.md).")


def options() -> Callable:
    """Declare every flag as a click option, spelled --a_b and --a-b."""

    def decorate(fn: Callable) -> Callable:
        for setting, kind in reversed(FLAGS.items()):
            spellings = [f"--{setting}"] + ([f"--{setting.replace('_', '-')}"] if "_" in setting else [])
            extra: dict[str, Any] = {"default": None}
            if kind == FLAG:
                extra.update(is_flag=True, default=False)
            elif kind == MANY:
                extra.update(multiple=True, default=())
            else:
                extra["type"] = kind
            if setting == "config_file":
                extra["help"] = CONFIG_FILE_HELP
            fn = click.option(*spellings, param(setting), **extra)(fn)
        return fn

    return decorate


def pop(kwargs: dict) -> dict[str, Any]:
    """Remove the Accelerate flags from a command's keyword arguments: the ones given, by setting."""
    given = {}
    for setting, kind in FLAGS.items():
        value = kwargs.pop(param(setting), None)
        if value is None or value is False or value == ():
            continue
        given[_SETTING_OF.get(setting, setting)] = list(value) if kind == MANY else value
    return given


def take(args: list[str], keep: set[str]) -> tuple[list[str], dict[str, Any]]:
    """The flags of the table (but ``keep``, the command's own) taken off a command line, up to `--`: the rest
    for click, and the ones given by setting. Values stay text; the translation converts and checks them."""
    rest: list[str] = []
    given: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        name, eq, inline = arg[2:].partition("=")
        setting = name.replace("-", "_")
        kind = FLAGS.get(setting) if arg.startswith("--") and setting not in keep else None
        if kind is None:
            rest.append(arg)
        elif kind == FLAG:
            if eq:
                raise click.UsageError(f"{arg}: --{name} takes no value")
            given[_SETTING_OF.get(setting, setting)] = True
        else:
            if not eq:
                if i + 1 == len(args):
                    raise click.UsageError(f"--{name} needs a value")
                i += 1
                inline = args[i]
            key = _SETTING_OF.get(setting, setting)
            given[key] = [*given.get(key, []), inline] if kind == MANY else inline
        i += 1
    return rest, given
