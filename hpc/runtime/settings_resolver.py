"""The Accelerator's settings, resolved in one place (as Lightning Fabric's _Connector does it).

Here are the arguments hpc refuses, the strategy chosen, and each setting's value, by one precedence: an argument
given in code, else the job's runtime config (HPC_RUNTIME_CONFIG), else the ACCELERATE_* variables `accelerate
launch` would have set, else hpc's default. PartialState and AcceleratorState ask the same questions before an
Accelerator exists (settings.job_setting), so they cannot answer differently.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpc.contract.runtime_config import RuntimeConfig, current_config
from hpc.errors import HpcError
from hpc.runtime.configuration import DataLoaderConfiguration, ProjectConfiguration
from hpc.runtime.handlers import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
)
from hpc.runtime.parallel.compile import Compile
from hpc.runtime.parallel.fp8 import RECIPES
from hpc.runtime.parallel.mesh import ParallelismConfig, TorchTensorParallelPlugin
from hpc.runtime.precision import normalize
from hpc.runtime.settings import (
    DEFAULT_ARRIVAL_TIMEOUT_S,
    DEFAULT_HANG_TIMEOUT_S,
    DEFAULT_STRAGGLER_THRESHOLD,
    MIN_KEEP,
    AcceleratorSettings,
    Checkpointing,
    Resilience,
    job_values,
)
from hpc.runtime.strategies import plugin_strategy
from hpc.runtime.strategies.megatron_plugin import MegatronLMPlugin
from hpc.runtime.strategies.plugins import DeepSpeedPlugin, FullyShardedDataParallelPlugin

HANDLERS = (DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs, AutocastKwargs, ProfileKwargs,
            *RECIPES)


def refuse_unsupported(*, device_placement: bool, rng_types, project_config, deepspeed_plugin, torch_tp_plugin,
                       megatron_lm_plugin, deepspeed_plugins, parallelism_config, **_resolved: Any) -> None:
    """What hpc cannot honour is refused by name rather than ignored."""
    if deepspeed_plugins is not None:
        raise HpcError("Accelerator(deepspeed_plugins=...) is not supported by hpc (several DeepSpeed engines are "
                       "not built in)", fix="pass one deepspeed_plugin")
    if megatron_lm_plugin is not None and not isinstance(megatron_lm_plugin, MegatronLMPlugin):
        raise HpcError(f"megatron_lm_plugin must be a MegatronLMPlugin, not {type(megatron_lm_plugin).__name__}",
                       fix="from hpc.utils import MegatronLMPlugin")
    if megatron_lm_plugin is not None and parallelism_config is not None:
        raise HpcError("megatron_lm_plugin and parallelism_config each lay out the mesh", fix="pass one of them")
    if not device_placement:
        raise HpcError("Accelerator(device_placement=False) is not supported by hpc (prepare() places models "
                       "and batches on the process's device)", fix="drop device_placement")
    if rng_types is not None:
        raise HpcError("Accelerator(rng_types=...) is not supported by hpc: its data order is seeded by (seed, "
                       "epoch), so no random state needs synchronising", fix="drop rng_types")
    if project_config is not None and project_config.save_on_each_node:
        raise HpcError("ProjectConfiguration(save_on_each_node=True) is not supported by hpc (checkpoints go to "
                       "the shared project folder)", fix="drop save_on_each_node")
    if isinstance(deepspeed_plugin, dict) and deepspeed_plugin and all(
            isinstance(v, DeepSpeedPlugin) for v in deepspeed_plugin.values()):
        raise HpcError("several named DeepSpeed plugins are not supported by hpc",
                       fix="pass one DeepSpeedPlugin (or a dict of its settings)")


def choose_strategy(values: dict, fsdp_plugin, deepspeed_plugin, megatron_lm_plugin=None) -> tuple[str | None, object]:
    """Code beats the runtime config: a plugin passed here picks its strategy. The Megatron-LM layout is asked for
    in code or by ACCELERATE_USE_MEGATRON_LM (with MEGATRON_LM_*, as `accelerate launch --use_megatron_lm` sets)."""
    given = [n for n, p in (("fsdp_plugin", fsdp_plugin), ("deepspeed_plugin", deepspeed_plugin),
                            ("megatron_lm_plugin", megatron_lm_plugin)) if p is not None]
    if len(given) > 1:
        raise HpcError(f"{' and '.join(given)} were both given", fix="pass one of them")
    if megatron_lm_plugin is not None:
        return "megatron", megatron_lm_plugin
    if fsdp_plugin is not None:
        return "fsdp", fsdp_plugin
    if deepspeed_plugin is not None:
        return "deepspeed", DeepSpeedPlugin.coerce(deepspeed_plugin)
    kind = values.get("strategy")
    if not given and os.environ.get("ACCELERATE_USE_MEGATRON_LM", "").strip().lower() in ("1", "true", "yes"):
        return "megatron", MegatronLMPlugin()
    if kind == "fsdp":
        return kind, FullyShardedDataParallelPlugin.from_config(values)
    if kind == "deepspeed":
        return kind, DeepSpeedPlugin.from_config(values)
    return kind, None


def handlers_by_type(given: list | None) -> dict:
    """kwargs_handlers by type; one hpc does not know is an error, never silently ignored."""
    handlers = {}
    for handler in given or []:
        if type(handler) not in HANDLERS:
            raise HpcError(f"kwargs_handlers: {type(handler).__name__} is not a handler hpc applies",
                           fix=f"use {', '.join(h.__name__ for h in HANDLERS)}")
        handlers[type(handler)] = handler
    return handlers


def _accumulation_steps(given, plugin, strategy_plugin, values: dict) -> int:
    if plugin is not None:
        if given not in (None, 1):
            raise HpcError("gradient_accumulation_steps and gradient_accumulation_plugin were both given",
                           fix="give the steps in GradientAccumulationPlugin(num_steps=...)")
        given = plugin.num_steps
    steps = given or getattr(strategy_plugin, "gradient_accumulation_steps", None) or values.get(
        "gradient_accumulation_steps") or 1
    if not isinstance(steps, int) or steps < 1:
        raise HpcError(f"gradient_accumulation_steps={steps!r} must be a whole number >= 1", fix="use 1 or more")
    return steps


def _first(*values, default):
    """The first value that is set (an argument, then the job's), else ``default``."""
    return next((v for v in values if v is not None), default)


def _resilience(config: RuntimeConfig | None, auto_resume: bool | None) -> Resilience:
    job = config if config is not None else RuntimeConfig()  # outside a job: the dataclass's defaults
    return Resilience(
        in_job=config is not None, auto_resume=bool(_first(auto_resume, job.auto_resume, default=False)),
        hang_timeout_s=float(_first(job.hang_timeout, default=DEFAULT_HANG_TIMEOUT_S if config else 0.0)),
        hang_requeue=bool(job.hang_requeue), requeue_signal=job.preemption.signal,
        max_requeues=int(job.preemption.max_requeues),
        lead_time_s=job.preemption.lead_time if job.warns_before_limit else None,
        script_resumes=bool(job.resume_args), resume_save_as=job.resume_save_as,
        straggler_threshold=float(_first(job.straggler_threshold, default=DEFAULT_STRAGGLER_THRESHOLD)),
        straggler_action=job.straggler_action or "warn")


def _checkpointing(config: RuntimeConfig | None, project: ProjectConfiguration, directory: Path, keep, async_save,
                   fsync, notes: list[str]) -> Checkpointing:
    job = config if config is not None else RuntimeConfig()
    limit = project.total_limit  # Accelerate's name for how many checkpoints to keep
    if limit is not None and limit < MIN_KEEP:
        notes.append(f"ProjectConfiguration(total_limit={limit}): hpc keeps {MIN_KEEP} checkpoints (the newest "
                     "may be damaged by a crash mid-save; the one before it must exist)")
    return Checkpointing(directory, int(_first(keep, job.checkpoint_keep, default=max(limit or MIN_KEEP, MIN_KEEP))),
                         bool(_first(async_save, job.checkpoint_async, default=False)),
                         bool(_first(fsync, job.checkpoint_fsync, default=False)),
                         float(job.hang_timeout or 0) or DEFAULT_ARRIVAL_TIMEOUT_S,
                         fast_tier=job.fast_tier if config is not None and job.fast_tier.enabled else None)


def resolve(arguments: dict) -> AcceleratorSettings:
    """The Accelerator's arguments, by their names: those hpc refuses first, then each against the job's."""
    refuse_unsupported(**arguments)
    return _resolve(**arguments)


def _resolve(*, split_batches, mixed_precision, gradient_accumulation_steps, cpu, dataloader_config, deepspeed_plugin,
             fsdp_plugin, project_dir, project_config, gradient_accumulation_plugin, kwargs_handlers, dynamo_backend,
             dynamo_plugin, auto_resume, checkpoint_keep, checkpoint_async, checkpoint_fsync,
             **_refused_or_kept: Any) -> AcceleratorSettings:
    dataloader_config = dataloader_config or DataLoaderConfiguration()
    if split_batches is not None:  # Accelerate's older spelling of dataloader_config.split_batches
        dataloader_config.split_batches = bool(split_batches)
    project = project_config or ProjectConfiguration()
    if project_dir is not None:
        project.set_directories(str(project_dir))
    config = current_config()
    values, notes = job_values(config)
    if dynamo_plugin is not None:  # code beats the job's settings
        values.update(dynamo_plugin.as_settings())
    if dynamo_backend is not None:
        values["dynamo_backend"] = str(getattr(dynamo_backend, "value", dynamo_backend))
    kind, plugin = choose_strategy(values, fsdp_plugin, deepspeed_plugin, _refused_or_kept.get("megatron_lm_plugin"))
    mesh_config, tp_plan = parallelism_of(_refused_or_kept.get("parallelism_config"),
                                          _refused_or_kept.get("torch_tp_plugin"))
    if mesh_config is not None and kind == "megatron":
        raise HpcError(f"ParallelismConfig {mesh_config.describe()} with the Megatron-LM layout: the plugin's "
                       "tp_degree and pp_degree lay out the mesh", fix="drop the ParallelismConfig variables")
    if mesh_config is not None:
        if kind == "deepspeed":
            raise HpcError(f"ParallelismConfig {mesh_config.describe()} with DeepSpeed: hpc composes tensor "
                           "parallelism with FSDP2 only", fix="drop the deepspeed plugin (FSDP2 shards the rest)")
        if kind != "fsdp":
            kind, plugin = "fsdp", fsdp_plugin or FullyShardedDataParallelPlugin.from_config(values)
    mode = normalize(mixed_precision or values.get("mixed_precision"))
    steps = _accumulation_steps(gradient_accumulation_steps, gradient_accumulation_plugin, plugin, values)
    handlers = handlers_by_type(kwargs_handlers)
    group = handlers.get(InitProcessGroupKwargs) or InitProcessGroupKwargs()
    if group.init_method is not None:
        raise HpcError("InitProcessGroupKwargs(init_method=...) is not used by hpc (ranks meet at MASTER_ADDR:"
                       "MASTER_PORT, env://)", fix="drop init_method")
    strategy_class = plugin_strategy(kind)
    where = Path(project.project_dir or ".")
    return AcceleratorSettings(
        dataloader_config, project, where, kind, plugin,
        needs_process_group=strategy_class is not None and strategy_class.needs_process_group, mixed_precision=mode,
        accumulation_steps=steps, handlers=handlers, process_group=group, cpu=bool(cpu or values.get("use_cpu")),
        debug=bool(values.get("debug")), compile=Compile.from_settings(values), notes=notes,
        resilience=_resilience(config, auto_resume),
        checkpointing=_checkpointing(config, project, where / "checkpoints", checkpoint_keep, checkpoint_async,
                                     checkpoint_fsync, notes), parallelism=mesh_config, tp_plan=tp_plan)


def parallelism_of(config, tp_plugin) -> tuple[Any, dict | None]:
    """The ParallelismConfig that needs a mesh (tp, dp_shard or cp > 1), or None: pure data parallelism is DDP (or
    the strategy asked for). Accelerate's launcher asks for one through ACCELERATE_USE_PARALLELISM_CONFIG and
    PARALLELISM_CONFIG_*; torch_tp_plugin's tp_size is one with tensor parallelism, FSDP sharding the rest."""
    if config is not None and not isinstance(config, ParallelismConfig):
        raise HpcError(f"parallelism_config must be a ParallelismConfig, not {type(config).__name__}",
                       fix="from hpc import ParallelismConfig")
    if config is None and os.environ.get("ACCELERATE_USE_PARALLELISM_CONFIG", "").lower() in ("1", "true", "yes"):
        config = ParallelismConfig()
    tp_plan = None
    if tp_plugin is not None:
        if not isinstance(tp_plugin, TorchTensorParallelPlugin):
            raise HpcError(f"torch_tp_plugin must be a TorchTensorParallelPlugin, not {type(tp_plugin).__name__}",
                           fix="from hpc.utils import TorchTensorParallelPlugin")
        if config is not None and config.tp_size not in (1, tp_plugin.tp_size):
            raise HpcError(f"torch_tp_plugin asks for tp_size {tp_plugin.tp_size}, the ParallelismConfig for "
                           f"{config.tp_size}", fix="give tp_size in one of them")
        if config is None:  # FSDP shards over the ranks tensor parallelism leaves (ParallelismConfig.fit)
            config = ParallelismConfig(tp_size=tp_plugin.tp_size)
            config.shard_the_rest = True
        config.tp_size, tp_plan = tp_plugin.tp_size, tp_plugin.tp_plan
    if config is not None and config.sp_size > 1:
        raise HpcError(f"ParallelismConfig sp_size {config.sp_size}: sequence parallelism (DeepSpeed's Ulysses) is "
                       "not built into hpc", fix=f"use cp_size={config.sp_size} (context parallelism also splits "
                       "the sequence over ranks) with sp_size 1")
    if config is None or not (config.tp_enabled or config.cp_enabled or config.dp_shard_enabled):
        return None, tp_plan
    return config, tp_plan
