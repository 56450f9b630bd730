"""Accelerate's settings in hpc's terms: one table for the three ways Accelerate users bring them.

`accelerate launch --fsdp_offload_params true`, an `accelerate config` file (`fsdp_config: {fsdp_offload_params:
true}`, flattened here) and the `FSDP_OFFLOAD_PARAMS` variable name the same setting. Each setting becomes
hpc job keys, a note saying what hpc does instead (SLURM already knows the machine rank), or a one-line error
(a TPU). Settings equal to Accelerate's own defaults ask for nothing and say nothing. Torch-free.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hpc.contract import mesh_sizes
from hpc.contract.accelerate_env import to_environ  # noqa: F401 - the other direction, for the same callers
from hpc.errors import ConfigError, shorten

TRUE = {"true", "1", "yes", "on"}
FALSE = {"false", "0", "no", "off", "none", ""}


@dataclass(repr=False, eq=False)  # only __init__: generated methods are compiled on every CLI start
class Translation:
    values: dict[str, Any] = field(default_factory=dict)  # hpc job keys
    notes: list[str] = field(default_factory=list)  # one line each: a setting hpc honours differently
    # what the user expects SLURM to have given (machine_rank, main_process_ip, ...): `hpc launch` checks them
    expected: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # hpc key -> the setting that set it, as written
    # what a submit says of the expected values (SLURM decides them); `hpc launch` checks them instead
    slurm_notes: list[str] = field(default_factory=list)


@dataclass(repr=False, eq=False)
class _Context:
    where: str  # the file, "command line" or "environment"
    spell: Callable[[str], str]  # a setting's name as the user wrote it
    base: Path | None  # relative paths in a config file are relative to it
    out: Translation

    def fail(self, name: str, value: Any, problem: str, fix: str) -> None:
        raise ConfigError(self.where, self.spell(name), value, problem, fix)

    def note(self, name: str, value: Any, text: str, *, slurm: bool = False) -> None:
        line = f"{self.where}: {self.spell(name)}={shorten(str(value))}: {text}"
        (self.out.slurm_notes if slurm else self.out.notes).append(line)


def _bool(ctx: _Context, name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    ctx.fail(name, value, "must be true or false", "write true or false")


def _int(ctx: _Context, name: str, value: Any) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        return int(str(value).strip())
    except ValueError:
        ctx.fail(name, value, "must be a whole number", "write e.g. 2")


def _float(ctx: _Context, name: str, value: Any) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        ctx.fail(name, value, "must be a number", "write e.g. 1.0")
    if not math.isfinite(number) or number < 0:  # nan, inf: no clipping norm or interval means them
        ctx.fail(name, value, "must be a finite number, 0 or more", "write e.g. 1.0")
    return number


def _seconds(ctx: _Context, name: str, value: Any) -> float:
    number = _float(ctx, name, value)
    if number <= 0:
        ctx.fail(name, value, "must be a positive number of seconds", "write e.g. 5")
    return number


def _upper(ctx: _Context, name: str, value: Any) -> str:
    return str(value).strip().upper()


def key(hpc_key: str, convert: Callable = lambda ctx, name, v: v) -> Callable:
    """The setting is the hpc job key ``hpc_key``."""

    def apply(ctx: _Context, name: str, value: Any) -> None:
        ctx.out.values[hpc_key] = convert(ctx, name, value)

    return apply


def quiet_if(*defaults: Any, note: str) -> Callable:
    """Accelerate's own default asks for nothing; any other value is explained in one line."""

    def apply(ctx: _Context, name: str, value: Any) -> None:
        if value in defaults or str(value).strip().lower() in {str(d).lower() for d in defaults}:
            return
        ctx.note(name, value, note)

    return apply


def refuse(*harmless: Any, problem: str, fix: str) -> Callable:
    """hpc cannot do what the setting asks; its harmless values (a default, "off") pass."""

    def apply(ctx: _Context, name: str, value: Any) -> None:
        if value in harmless or str(value).strip().lower() in {str(h).lower() for h in harmless}:
            return
        ctx.fail(name, value, problem, fix)

    return apply


def expect(what: str, convert: Callable, note: str) -> Callable:
    """SLURM decides it; `hpc launch` in a job checks the user's value against SLURM's, a submit explains."""

    def apply(ctx: _Context, name: str, value: Any) -> None:
        if value is None:
            return
        ctx.out.expected[what] = convert(ctx, name, value)
        if not (what == "machine_rank" and ctx.out.expected[what] == 0):  # Accelerate's default says nothing
            ctx.note(name, value, note, slurm=True)

    return apply


_DISTRIBUTED = {
    "NO": {},
    "MULTI_GPU": {"strategy": "ddp"},
    "MULTI_CPU": {"strategy": "ddp", "use_cpu": True},
    "FSDP": {"strategy": "fsdp"},
    "DEEPSPEED": {"strategy": "deepspeed"},
}


def switch(strategy: str, *, keep_chosen: bool = False) -> Callable:
    """A flag that picks the strategy when true (`--use_fsdp`); --multi_gpu leaves a chosen one alone."""

    def apply(ctx: _Context, name: str, value: Any) -> None:
        if not _bool(ctx, name, value):
            return
        if keep_chosen:
            ctx.out.values.setdefault("strategy", strategy)
        else:
            ctx.out.values["strategy"] = strategy

    return apply


def ignore(ctx: _Context, name: str, value: Any) -> None:
    """The command line's own business (-m, --no_python, --quiet): read where the command is built."""


def _distributed_type(ctx: _Context, name: str, value: Any) -> None:
    kind = str(getattr(value, "value", value)).strip().upper()
    if kind == "MEGATRON_LM":  # Megatron-LM's layout on torch's parallelism: the job's Accelerator reads it
        env = dict(ctx.out.values.get("env") or {})
        env["ACCELERATE_USE_MEGATRON_LM"] = "true"
        ctx.out.values["env"] = env
        return
    if kind not in _DISTRIBUTED:
        ctx.fail(name, value, "is a device or engine hpc does not run (it runs CPUs and NVIDIA GPUs)",
                 f"use one of {', '.join(_DISTRIBUTED)}")
    ctx.out.values.update(_DISTRIBUTED[kind])


def _compute_environment(ctx: _Context, name: str, value: Any) -> None:
    if str(value).strip().upper() != "LOCAL_MACHINE":
        ctx.fail(name, value, "is not a SLURM cluster or this machine", "use LOCAL_MACHINE (hpc brings the cluster)")


def _mixed_precision(ctx: _Context, name: str, value: Any) -> None:
    mode = str(value).strip().lower()
    allowed = ("no", "fp16", "bf16", "fp8")
    if mode not in allowed:
        ctx.fail(name, value, "is not a precision", f"use one of {', '.join(allowed)}")
    ctx.out.values["mixed_precision"] = mode
    if mode == "fp8":
        ctx.note(name, value, "hpc's fp8 is torchao's Float8Linear and needs GPUs with fp8 tensor cores (compute "
                              "capability 8.9+); elsewhere the job stops with one line")


def _num_processes(ctx: _Context, name: str, value: Any) -> None:
    n = _int(ctx, name, value)
    if n > 0:  # accelerate config writes -1 for "not said"
        ctx.out.values["num_processes"] = n
        ctx.out.expected["num_processes"] = n


def _num_machines(ctx: _Context, name: str, value: Any) -> None:
    n = _int(ctx, name, value)
    if n < 1:
        ctx.fail(name, n, "must be 1 or more", "write the number of nodes")
    ctx.out.values["nodes"] = n
    ctx.out.expected["num_machines"] = n


def _gpu_ids(ctx: _Context, name: str, value: Any) -> None:
    text = str(value).strip()
    if text.lower() in ("all", ""):
        return
    ids = [i.strip() for i in text.split(",")]
    if not all(i.isdigit() for i in ids):
        ctx.fail(name, value, "must be 'all' or GPU numbers", "write e.g. 0,1")
    ctx.out.values["gpu_ids"] = ",".join(ids)


def _offload_device(flag_key: str) -> Callable:
    def apply(ctx: _Context, name: str, value: Any) -> None:
        device = str(value).strip().lower()
        if device == "nvme":
            ctx.fail(name, value, "NVMe offload is not wired up in hpc", "use cpu or none")
        if device not in ("cpu", "none", ""):
            ctx.fail(name, value, "is not an offload device", "use cpu or none")
        ctx.out.values[flag_key] = device == "cpu"

    return apply


def _deepspeed_config_file(ctx: _Context, name: str, value: Any) -> None:
    path = Path(str(value)).expanduser()
    if not path.is_absolute() and ctx.base is not None:
        path = ctx.base / path  # as Accelerate reads it: relative to the config file
    ctx.out.values["deepspeed_config"] = os.path.normpath(path)


_WRAP = {"TRANSFORMER_BASED_WRAP": "TRANSFORMER_AUTO_WRAP", "TRANSFORMER_AUTO_WRAP": "TRANSFORMER_AUTO_WRAP",
         "SIZE_BASED_WRAP": "SIZE_BASED_WRAP", "NO_WRAP": "NO_WRAP"}
_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
_STATE_DICTS = {"FULL_STATE_DICT": "FULL_STATE_DICT", "SHARDED_STATE_DICT": "SHARDED_STATE_DICT"}


def _auto_wrap(ctx: _Context, name: str, value: Any) -> None:
    policy = str(value).strip().upper()
    if policy not in _WRAP:
        ctx.fail(name, value, "is not a wrap policy", "use TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP")
    ctx.out.values["fsdp_auto_wrap_policy"] = _WRAP[policy]


def _sharding(ctx: _Context, name: str, value: Any) -> None:
    text = str(value).strip().upper()
    if text.isdigit() and 1 <= int(text) <= len(_SHARDING):  # `accelerate config` once wrote numbers
        text = _SHARDING[int(text) - 1]
    if text not in _SHARDING:
        ctx.fail(name, value, "is not a sharding strategy", f"use one of {', '.join(_SHARDING)}")
    ctx.out.values["fsdp_sharding_strategy"] = text


def _state_dict(ctx: _Context, name: str, value: Any) -> None:
    text = str(value).strip().upper()
    if text not in _STATE_DICTS:
        ctx.fail(name, value, "is not a state dict type hpc saves (LOCAL_STATE_DICT is FSDP1's own)",
                 "use FULL_STATE_DICT or SHARDED_STATE_DICT")
    ctx.out.values["fsdp_state_dict_type"] = _STATE_DICTS[text]


def _layer_classes(ctx: _Context, name: str, value: Any) -> None:
    names = value if isinstance(value, list) else str(value).split(",")
    ctx.out.values["fsdp_transformer_layer_cls_to_wrap"] = [str(n).strip() for n in names if str(n).strip()]


def _reshard(ctx: _Context, name: str, value: Any) -> None:
    text = str(value).strip().upper()
    if text.isdigit() and 1 <= int(text) <= len(_SHARDING):
        text = _SHARDING[int(text) - 1]
    if text in _SHARDING:  # Accelerate >= 1.6 writes FSDP1's sharding strategy here
        ctx.out.values["fsdp_reshard_after_forward"] = text in ("FULL_SHARD", "HYBRID_SHARD")
        ctx.out.values.setdefault("fsdp_sharding_strategy", text)
        return
    ctx.out.values["fsdp_reshard_after_forward"] = _bool(ctx, name, value)


def _dynamo_backend(ctx: _Context, name: str, value: Any) -> None:
    backend = str(value).strip().lower()
    if backend not in ("no", ""):
        ctx.out.values["dynamo_backend"] = backend


def _env_lines(ctx: _Context, name: str, value: Any) -> None:
    items = value if isinstance(value, list) else [value]
    env = dict(ctx.out.values.get("env") or {})
    for item in items:
        k, sep, v = str(item).partition("=")
        if not sep or not k:
            ctx.fail(name, item, "must be NAME=VALUE", "write e.g. --env NCCL_DEBUG=INFO")
        env[k.strip()] = v
    ctx.out.values["env"] = env


_TPU = refuse(None, False, "false", [], "", problem="is for TPUs; hpc runs CPUs and NVIDIA GPUs", fix="remove it")


def _spelled(ctx: _Context, name: str, other: str) -> str:
    """Another setting, written the way the user wrote this one: --flag on a command line, the key in a file."""
    return f"--{other}" if ctx.spell(name).startswith("--") else other


# the Megatron-LM settings hpc reads in the job (MegatronLMPlugin, from the MEGATRON_LM_* variables Accelerate's
# launcher sets) and how each is checked here
_MEGATRON_READ = {"tp_degree": "int", "pp_degree": "int", "num_micro_batches": "int", "sequence_parallelism": "bool",
                  "recompute_activations": "bool", "use_distributed_optimizer": "bool", "gradient_clipping": "float",
                  "pipeline_schedule": "schedule", "num_layers_per_virtual_pipeline_stage": "int"}
# the torch.distributed.pipelining schedules the Megatron-LM layout runs (hpc/runtime/parallel/pipeline.py): one
# stage per rank, or several (virtual stages, Megatron-LM's interleaving)
PIPELINE_SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b", "looped_bfs")
# the ones whose default asks for nothing; other values have no counterpart in hpc's layout
_MEGATRON_QUIET = {"context_parallel_size": ("1", "2", "none", ""), "expert_model_parallel_size": ("1", "none", ""),
                   "expert_tensor_parallel_size": ("1", "none", ""), "use_custom_fsdp": ("false", "none", ""),
                   "optimizer_cpu_offload": ("false", "none", "")}


def _megatron(ctx: _Context, name: str, value: Any) -> None:
    """distributed_type MEGATRON_LM's settings: the MEGATRON_LM_* variables the job's MegatronLMPlugin reads, as
    `accelerate launch --use_megatron_lm` exports them; hpc lays them over torch's parallelism
    (hpc/runtime/strategies/megatron.py)."""
    env = dict(ctx.out.values.get("env") or {})
    if name == "use_megatron_lm":
        if _bool(ctx, name, value):
            env["ACCELERATE_USE_MEGATRON_LM"] = "true"
        ctx.out.values["env"] = env
        return
    setting = name
    while setting.startswith("megatron_lm_"):  # a config file's megatron_lm_config keys carry the prefix already
        setting = setting.removeprefix("megatron_lm_")
    if value is None:  # `accelerate config` writes null for "not said"
        return
    kind = _MEGATRON_READ.get(setting)
    if kind == "int":
        number = _int(ctx, name, value)
        if number < 1:
            ctx.fail(name, value, "must be 1 or more", "write e.g. 2")
        text = str(number)
    elif kind == "bool":
        text = _flag_text(_bool(ctx, name, value))
    elif kind == "float":
        text = str(_float(ctx, name, value))
    elif kind == "schedule":
        text = str(value).strip().lower()
        if text not in PIPELINE_SCHEDULES:
            ctx.fail(name, value, "is not a pipeline schedule hpc runs", f"use {', '.join(PIPELINE_SCHEDULES)}")
    else:
        if str(value).strip().lower() not in _MEGATRON_QUIET.get(setting, ()):
            ctx.note(name, value, "not used by hpc's Megatron-LM layout (it lays tp_degree x pp_degree x data "
                                  "parallelism over torch's own parallelism)")
        return
    env[f"MEGATRON_LM_{setting.upper()}"] = text
    ctx.out.values["env"] = env


def _flag_text(flag: bool) -> str:
    return "true" if flag else "false"


_MEGATRON = _megatron
# the context-parallel settings the job's ParallelismConfig reads (hpc.runtime.parallel.mesh), and their values
_CP_CHOICES = {"cp_comm_strategy": ("allgather", "alltoall"), "cp_backend": ("torch",)}


def _parallelism(ctx: _Context, name: str, value: Any) -> None:
    """`--use_parallelism_config`, `--parallelism_config_tp_size 2`, `--parallelism_config_cp_size 2`, ...: the
    variables Accelerate's launcher sets for every process, which ParallelismConfig() reads
    (hpc.runtime.parallel.mesh). sp_size > 1 (DeepSpeed Ulysses) is refused; its other settings are noted."""
    env = dict(ctx.out.values.get("env") or {})
    setting = name.removeprefix("parallelism_config_")
    if name == "use_parallelism_config":
        if _bool(ctx, name, value):
            env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    elif setting in _CP_CHOICES:
        choice, allowed = str(value).strip().lower(), _CP_CHOICES[setting]
        if value is None or not choice:  # not said (a config file's null): the job's default
            return
        if choice not in allowed:
            problem = ("is not a strategy torch's context parallelism has" if setting == "cp_comm_strategy" else
                       "is not a context-parallel backend hpc runs (it runs torch's)")
            ctx.fail(name, value, problem, f"use {' or '.join(allowed)}")
        env[f"PARALLELISM_CONFIG_{setting.upper()}"] = choice
    elif setting == "sp_size":
        size = _int(ctx, name, value)
        if size < 1:
            ctx.fail(name, value, "must be 1 or more", "write e.g. 2")
        if size > 1:
            ctx.fail(name, value, "sequence parallelism (DeepSpeed Ulysses) is not built into hpc",
                     f"use {_spelled(ctx, name, 'parallelism_config_cp_size')} {size} instead (context parallelism "
                     "also splits the sequence over ranks), with sp_size 1")
        return
    elif not setting.endswith("_size"):
        ctx.note(name, value, "not used by hpc (sequence parallelism, DeepSpeed Ulysses, is not built in; "
                              "cp_size splits the sequence)")
        return
    else:
        dim = setting.removesuffix("_size")
        size = _int(ctx, name, value)
        if size < 1:
            ctx.fail(name, value, "must be 1 or more", "write e.g. 2")
        if dim not in mesh_sizes.DIMS:  # a dimension hpc does not build: harmless at 1
            if size > 1:
                ctx.fail(name, value, "is not a dimension hpc's ParallelismConfig builds",
                         "use the dp_replicate, dp_shard, tp and cp sizes")
            return
        env[mesh_sizes.variable(dim)] = str(size)
        env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    ctx.out.values["env"] = env


_PARALLELISM = _parallelism

# setting name (flat, as the launch flag and the config file spell it) -> what it becomes
SETTINGS: dict[str, Callable] = {
    "compute_environment": _compute_environment,
    "distributed_type": _distributed_type,
    "mixed_precision": _mixed_precision,
    "use_cpu": key("use_cpu", _bool),
    "cpu": key("use_cpu", _bool),
    "multi_gpu": switch("ddp", keep_chosen=True),
    "debug": key("debug", _bool),
    "num_processes": _num_processes,
    "num_machines": _num_machines,
    "machine_rank": expect("machine_rank", _int, "SLURM numbers the nodes; hpc submit leaves it to SLURM"),
    "main_process_ip": expect("main_process_ip", lambda ctx, n, v: str(v),
                              "the job's first node is the main process"),
    "main_process_port": key("main_process_port", _int),
    "gpu_ids": _gpu_ids,
    "rdzv_backend": quiet_if("static", "c10d", note="is not a rendezvous torch knows; hpc uses static (srun) "
                                                    "or c10d (torchrun)"),
    "rdzv_conf": quiet_if("", None, note="hpc's torchrun rendezvous takes no extra settings; it is not used"),
    # whether the nodes share a fast network: hpc's ranks always meet over the profile's network_interface
    "same_network": lambda ctx, name, v: _bool(ctx, name, v),  # checked, nothing to do (see the comment above)
    "main_training_function": quiet_if("main", None, note="only notebook_launcher calls a function by name"),
    "enable_cpu_affinity": quiet_if(False, note="hpc binds CPUs with the profile's cpu_bind (srun --cpu-bind)"),
    "num_cpu_threads_per_process": key("cpu_threads_per_process", _int),
    "max_restarts": key("max_restarts", _int),
    "monitor_interval": key("monitor_interval", _seconds),
    "module": ignore,
    "no_python": ignore,
    "quiet": ignore,
    "tee": quiet_if("0", 0, note="each rank already writes logs/rank<N>-<job>.out; hpc logs -f follows them"),
    "log_dir": quiet_if(None, note="hpc writes each rank's log under the job folder's logs/"),
    "role": quiet_if("default", None, note="torchrun's worker role name is not used by hpc"),
    "env": _env_lines,
    "downcast_bf16": quiet_if(False, "no", note="is for TPUs; it has no effect on CPUs and GPUs"),
    "gradient_accumulation_steps": key("gradient_accumulation_steps", _int),
    "gradient_clipping": key("gradient_clipping", _float),
    # torch.compile in prepare()
    "dynamo_backend": _dynamo_backend,
    "dynamo_mode": key("dynamo_mode", lambda ctx, n, v: str(v).strip().lower()),
    "dynamo_use_fullgraph": key("dynamo_use_fullgraph", _bool),
    "dynamo_use_dynamic": key("dynamo_use_dynamic", _bool),
    "dynamo_use_regional_compilation": key("dynamo_use_regional_compilation", _bool),
    # FSDP (hpc runs FSDP2: fully_shard)
    "use_fsdp": switch("fsdp"),
    "fsdp_version": quiet_if(2, "2", note="hpc runs FSDP2 (fully_shard); FSDP1's settings are translated to it"),
    "fsdp_sharding_strategy": _sharding,
    "fsdp_auto_wrap_policy": _auto_wrap,
    "fsdp_transformer_layer_cls_to_wrap": _layer_classes,
    "fsdp_min_num_params": key("fsdp_min_num_params", _int),
    "fsdp_offload_params": key("fsdp_cpu_offload", _bool),
    "fsdp_state_dict_type": _state_dict,
    "fsdp_activation_checkpointing": key("fsdp_activation_checkpointing", _bool),
    "fsdp_reshard_after_forward": _reshard,
    "fsdp_cpu_ram_efficient_loading": key("fsdp_cpu_ram_efficient_loading", _bool),
    "fsdp_sync_module_states": key("fsdp_sync_module_states", _bool),
    "fsdp_use_orig_params": quiet_if(True, "true", note="FSDP2 always trains the original parameters"),
    "fsdp_backward_prefetch": quiet_if("BACKWARD_PRE", None, note="FSDP2 prefetches the next module's "
                                                                  "parameters before its backward, always"),
    "fsdp_forward_prefetch": quiet_if(False, "false", note="FSDP2 prefetches one module ahead in forward by "
                                                          "itself; explicit forward prefetch is not used"),
    "fsdp_ignored_modules": refuse(None, "", problem="ignored modules are not supported by hpc's FSDP",
                                   fix="remove it"),
    # DeepSpeed
    "use_deepspeed": switch("deepspeed"),
    "deepspeed_config_file": _deepspeed_config_file,
    "zero_stage": key("zero_stage", _int),
    "offload_optimizer_device": _offload_device("offload_optimizer"),
    "offload_param_device": _offload_device("offload_param"),
    "offload_optimizer_nvme_path": quiet_if(None, "none", "", note="NVMe offload is not wired up in hpc"),
    "offload_param_nvme_path": quiet_if(None, "none", "", note="NVMe offload is not wired up in hpc"),
    "zero3_init_flag": quiet_if(False, "false", None, note="a transformers model is built whole on each rank, "
                                                          "then partitioned; ZeRO-3 init is not wired up"),
    "zero3_save_16bit_model": quiet_if(True, "true", None, note="hpc's save_model always gathers the whole "
                                                                "ZeRO-3 model; it never skips it"),
    "deepspeed_multinode_launcher": quiet_if(None, note="hpc starts DeepSpeed's ranks itself (srun, or "
                                                        "--launcher deepspeed through DeepSpeed's slurm runner)"),
    "deepspeed_hostfile": quiet_if(None, note="hpc writes the hostfile from the job's allocation"),
    "deepspeed_inclusion_filter": quiet_if(None, note="choose nodes with --nodelist instead"),
    "deepspeed_exclusion_filter": quiet_if(None, note="leave nodes out with sbatch_extra: [--exclude=...]"),
    "deepspeed_moe_layer_cls_names": refuse(None, "", problem="DeepSpeed MoE leaf modules are not set up by hpc",
                                            fix="remove it"),
    "mpirun_hostfile": quiet_if(None, note="hpc starts CPU ranks with srun; no mpirun hostfile is needed"),
    "mpirun_ccl": quiet_if(None, 0, "0", note="oneCCL is not used; CPU ranks talk over gloo"),
    "ipex": quiet_if(False, None, note="IPEX is not applied by hpc"),
    "use_ipex": quiet_if(False, None, note="IPEX is not applied by hpc"),
    # the flags of `accelerate launch` for engines and devices hpc does not run
    "use_megatron_lm": _MEGATRON,
    "use_parallelism_config": _PARALLELISM,
    "tpu": _TPU,
    "tpu_cluster": _TPU,
    "no_tpu_cluster": ignore,
    "tpu_use_cluster": _TPU,
    "tpu_use_sudo": _TPU,
    "tpu_name": _TPU,
    "tpu_zone": _TPU,
    "tpu_vm": _TPU,
    "tpu_env": _TPU,
    "commands": _TPU,
    "command_file": _TPU,
}

# `accelerate config` nests some settings; their keys join the flat table (deepspeed_config's unprefixed)
_NESTED_PREFIX = {"fsdp_config": "", "deepspeed_config": "", "dynamo_config": "", "mpirun_config": "",
                  "ipex_config": "", "fp8_config": "fp8_", "megatron_lm_config": "megatron_lm_",
                  "parallelism_config": ""}  # its keys carry the prefix already


def _fp8_setting(ctx: _Context, name: str, value: Any) -> None:
    if name == "fp8_backend" and str(value).strip().upper() not in ("AO", "", "NONE"):
        ctx.fail(name, value, "hpc's fp8 is torchao's (AO); TransformerEngine and MS-AMP are not driven by hpc",
                 "write AO, or leave fp8_backend out")
    if name != "fp8_backend":
        ctx.note(name, value, "not read by hpc: its fp8 is torchao's with its defaults; pass AORecipeKwargs(config="
                              "Float8LinearConfig(...)) in the script for others")


def _handler(name: str) -> Callable | None:
    if name in SETTINGS:
        return SETTINGS[name]
    if name.startswith("fp8_"):
        return _fp8_setting
    if name.startswith("megatron_lm_"):
        return _MEGATRON
    if name.startswith("parallelism_config_"):
        return _PARALLELISM
    return None


def flatten(settings: dict) -> dict[str, tuple[str, Any]]:
    """Nested config-file mappings -> flat setting name -> (the key as written, value). A null is left out:
    `accelerate config` writes it for "not said" (gpu_ids, main_process_ip, main_process_port, ...), and Accelerate
    reads it as unset."""
    flat: dict[str, tuple[str, Any]] = {}
    for name, value in settings.items():
        if name in _NESTED_PREFIX and isinstance(value, dict):
            prefix = _NESTED_PREFIX[name]
            for inner, v in value.items():  # Accelerate writes megatron_lm_config's keys with their prefix
                if v is not None:
                    flat[inner if inner.startswith(prefix) else prefix + inner] = (f"{name}.{inner}", v)
        elif value is None or (name in _NESTED_PREFIX and value == {}):
            continue
        else:
            flat[name] = (name, value)
    return flat


# where and on what the job runs: a named file or flag says it for this job; Accelerate's default file says it for
# the machine `accelerate config` ran on (often a laptop or login node), so from there it is not applied
MACHINE_SHAPE = ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port", "use_cpu",
                 "gpu_ids", "cpu")


def translate(settings: dict, where: str, *, base: Path | None = None,
              spell: Callable[[str], str] | None = None, default_file: bool = False) -> Translation:
    """Accelerate's settings (flat or as a config file nests them) -> hpc job keys, notes and expectations."""
    out = Translation()
    flat = flatten(settings)
    if default_file:
        shape = [n for n in MACHINE_SHAPE if n in flat]
        if str(flat.get("distributed_type", (None, ""))[1]).upper() == "MULTI_CPU":
            flat["distributed_type"] = (flat["distributed_type"][0], "MULTI_GPU")  # data parallel, device aside
            shape.append("distributed_type MULTI_CPU")
        for name in MACHINE_SHAPE:
            flat.pop(name, None)
        if shape:
            out.notes.append(f"{where}: {', '.join(shape)}: not applied from Accelerate's default file (it describes "
                             "the machine `accelerate config` ran on); name it with --config_file to use them")
    written = {name: as_written for name, (as_written, _) in flat.items()}
    ctx = _Context(where, spell or (lambda name: written.get(name, name)), base, out)
    for name, (as_written, value) in flat.items():
        handler = _handler(name)
        if handler is None:
            from hpc.contract.validate import unknown_key_error

            raise unknown_key_error(where, as_written, value, sorted(SETTINGS))
        before = dict(out.values)
        handler(ctx, name, value)
        for hpc_key, v in out.values.items():
            if hpc_key not in before or before[hpc_key] != v:
                out.origin[hpc_key] = ctx.spell(name)
    return out


# the variables `accelerate launch` exports and Accelerate's Accelerator reads -> the setting each one carries
ENV_SETTINGS = {
    "ACCELERATE_MIXED_PRECISION": "mixed_precision",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "gradient_accumulation_steps",
    "ACCELERATE_GRADIENT_CLIPPING": "gradient_clipping",
    "ACCELERATE_USE_CPU": "use_cpu",
    "ACCELERATE_DEBUG_MODE": "debug",
    "ACCELERATE_CPU_AFFINITY": "enable_cpu_affinity",
    "ACCELERATE_DOWNCAST_BF16": "downcast_bf16",
    "ACCELERATE_DYNAMO_BACKEND": "dynamo_backend",
    "ACCELERATE_DYNAMO_MODE": "dynamo_mode",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": "dynamo_use_fullgraph",
    "ACCELERATE_DYNAMO_USE_DYNAMIC": "dynamo_use_dynamic",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "dynamo_use_regional_compilation",
    "ACCELERATE_USE_FSDP": "use_fsdp",
    "FSDP_VERSION": "fsdp_version",
    "FSDP_SHARDING_STRATEGY": "fsdp_sharding_strategy",
    "FSDP_AUTO_WRAP_POLICY": "fsdp_auto_wrap_policy",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "fsdp_transformer_layer_cls_to_wrap",
    "FSDP_MIN_NUM_PARAMS": "fsdp_min_num_params",
    "FSDP_OFFLOAD_PARAMS": "fsdp_offload_params",
    "FSDP_STATE_DICT_TYPE": "fsdp_state_dict_type",
    "FSDP_ACTIVATION_CHECKPOINTING": "fsdp_activation_checkpointing",
    "FSDP_RESHARD_AFTER_FORWARD": "fsdp_reshard_after_forward",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "fsdp_cpu_ram_efficient_loading",
    "FSDP_SYNC_MODULE_STATES": "fsdp_sync_module_states",
    "FSDP_USE_ORIG_PARAMS": "fsdp_use_orig_params",
    "FSDP_BACKWARD_PREFETCH": "fsdp_backward_prefetch",
    "FSDP_FORWARD_PREFETCH": "fsdp_forward_prefetch",
    "ACCELERATE_USE_DEEPSPEED": "use_deepspeed",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "zero_stage",
    "ACCELERATE_DEEPSPEED_CONFIG_FILE": "deepspeed_config_file",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "offload_optimizer_device",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "offload_param_device",
    "ACCELERATE_DEEPSPEED_ZERO3_INIT": "zero3_init_flag",
    "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "zero3_save_16bit_model",
    "ACCELERATE_USE_MEGATRON_LM": "use_megatron_lm",
}


def from_environ(environ) -> Translation:
    """The ACCELERATE_*, FSDP_* and MEGATRON_LM_* variables set in this process, in hpc's terms."""
    settings = {ENV_SETTINGS[name]: value for name, value in environ.items() if name in ENV_SETTINGS}
    settings.update({name.lower(): value for name, value in environ.items() if name.startswith("MEGATRON_LM_")})
    by_setting = {setting: name for name, setting in ENV_SETTINGS.items()}
    return translate(settings, "environment", spell=lambda setting: by_setting.get(
        setting, setting.upper() if setting.startswith("megatron_lm_") else setting))
