"""`Accelerator`: the names Accelerate users know, as a thin facade.

Backend differences live in strategies (single process, DDP, FSDP2, DeepSpeed), precision in
precision.py, sharding in data.py, collectives in ops.py. Settings come from the job's runtime config file
(HPC_RUNTIME_CONFIG), above the ACCELERATE_* variables `accelerate launch` would have set; arguments given here
override both.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import signal
import socket
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpc.contract import accelerate_settings, layout, runtime_config
from hpc.errors import HpcError
from hpc.runtime import excepthook, model_files, ops, tracking
from hpc.runtime.checkpoint import notices
from hpc.runtime.checkpoint.checkpointer import Checkpointer
from hpc.runtime.checkpoint.store import MIN_KEEP, CheckpointStore
from hpc.runtime.compile import Compile, TorchDynamoPlugin
from hpc.runtime.configuration import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
from hpc.runtime.data.prepare import PreparedDataLoader, SkipFirstBatches
from hpc.runtime.deepspeed_dummies import DummyOptim, DummyScheduler, EngineScheduler
from hpc.runtime.gradient_state import GradientState
from hpc.runtime.handlers import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
)
from hpc.runtime.nest import all_tensors
from hpc.runtime.plugins import DeepSpeedPlugin, FullyShardedDataParallelPlugin
from hpc.runtime.precision import Precision, normalize
from hpc.runtime.process_env import ProcessState
from hpc.runtime.resilience import preemption
from hpc.runtime.resilience.pace import Pace
from hpc.runtime.resilience.stop_vote import StopVote
from hpc.runtime.resilience.watchdog import HangWatchdog
from hpc.runtime.strategies import choose, plugin_strategy
from hpc.runtime.training_state import TrainingState
from hpc.runtime.wrappers import AcceleratedOptimizer, AcceleratedScheduler


class StateHooks:
    """save_state/load_state pre-hooks, by registration order, each removable through its handle."""

    def __init__(self):
        self.save: collections.OrderedDict = collections.OrderedDict()  # weakly referenced by the handles
        self.load: collections.OrderedDict = collections.OrderedDict()

    def add(self, kind: str, hook):
        from torch.utils.hooks import RemovableHandle

        table = getattr(self, kind)
        handle = RemovableHandle(table)
        table[handle.id] = hook
        return handle


@dataclass(frozen=True)
class ResumeInfo:
    """Where a resumed run stands: optimizer steps done, the first dataloader's epoch and batch in it."""

    path: Path
    step: int
    epoch: int
    batch: int


def _choose_strategy(config: dict, fsdp_plugin, deepspeed_plugin) -> tuple[str | None, object]:
    """Code beats the runtime config: a plugin passed here picks its strategy."""
    if fsdp_plugin is not None and deepspeed_plugin is not None:
        raise HpcError("fsdp_plugin and deepspeed_plugin were both given", fix="pass one of them")
    if fsdp_plugin is not None:
        return "fsdp", fsdp_plugin
    if deepspeed_plugin is not None:
        return "deepspeed", DeepSpeedPlugin.coerce(deepspeed_plugin)
    kind = config.get("strategy")
    if kind == "fsdp":
        return kind, FullyShardedDataParallelPlugin.from_config(config)
    if kind == "deepspeed":
        return kind, DeepSpeedPlugin.from_config(config)
    return kind, None


# seconds without a step before a job's ranks are declared hung (profile/job key hang_timeout; 0: off). Far below
# torch's own collective timeouts (gloo 30 min, NCCL 10 min), above any sane step; saves and loads are exempt.
DEFAULT_HANG_TIMEOUT_S = 300.0


def _refuse_unsupported(**given: Any) -> None:
    for name, value in given.items():
        if value is not None:
            raise HpcError(f"Accelerator({name}=...) is not supported by hpc (tensor/context parallelism, "
                           "Megatron-LM and several DeepSpeed engines are not built in)",
                           fix=f"drop {name}; FSDP (HYBRID_SHARD) and DeepSpeed ZeRO are hpc's strategies")


_HANDLERS = (DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs, AutocastKwargs, ProfileKwargs)


def _handlers(given: list | None) -> dict:
    """kwargs_handlers by type; one hpc does not know is an error, never silently ignored."""
    handlers = {}
    for handler in given or []:
        if type(handler) not in _HANDLERS:
            raise HpcError(f"kwargs_handlers: {type(handler).__name__} is not a handler hpc applies",
                           fix=f"use {', '.join(h.__name__ for h in _HANDLERS)}")
        handlers[type(handler)] = handler
    return handlers


class _NoTracker:
    """What get_tracker gives where no tracker runs: any call does nothing."""

    name = None

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class Accelerator:
    def __init__(self, device_placement: bool = True, split_batches: bool | None = None,
                 mixed_precision: str | None = None, gradient_accumulation_steps: int | None = None,
                 cpu: bool = False, dataloader_config: DataLoaderConfiguration | None = None,
                 deepspeed_plugin: DeepSpeedPlugin | dict | None = None,
                 fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
                 torch_tp_plugin: Any = None, megatron_lm_plugin: Any = None, rng_types: list | None = None,
                 log_with: str | list | None = None, project_dir: str | os.PathLike | None = None,
                 project_config: ProjectConfiguration | None = None,
                 gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
                 step_scheduler_with_optimizer: bool = True, kwargs_handlers: list | None = None,
                 dynamo_backend: str | None = None, dynamo_plugin: TorchDynamoPlugin | None = None,
                 deepspeed_plugins: Any = None,
                 parallelism_config: Any = None, *, seed: int = 0,
                 auto_resume: bool | None = None, checkpoint_keep: int | None = None,
                 checkpoint_async: bool | None = None, checkpoint_fsync: bool | None = None):
        """Accelerate 1.15's keywords, in its order (hpc's own after `*`). What hpc cannot honour is refused by
        name rather than ignored."""
        excepthook.install()  # a refusal below is one line per rank, not a traceback on each
        _refuse_unsupported(torch_tp_plugin=torch_tp_plugin, megatron_lm_plugin=megatron_lm_plugin,
                            deepspeed_plugins=deepspeed_plugins, parallelism_config=parallelism_config)
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
        self.device_placement = device_placement
        self.dataloader_config = dataloader_config or DataLoaderConfiguration()
        if split_batches is not None:  # Accelerate's older spelling of dataloader_config.split_batches
            self.dataloader_config.split_batches = bool(split_batches)
        self.gradient_accumulation_plugin = gradient_accumulation_plugin
        if gradient_accumulation_plugin is not None:
            if gradient_accumulation_steps not in (None, 1):
                raise HpcError("gradient_accumulation_steps and gradient_accumulation_plugin were both given",
                               fix="give the steps in GradientAccumulationPlugin(num_steps=...)")
            gradient_accumulation_steps = gradient_accumulation_plugin.num_steps
        self.project_configuration = project_config or ProjectConfiguration()
        if project_dir is not None:
            self.project_configuration.set_directories(str(project_dir))
        project_dir = self.project_configuration.project_dir
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        config = runtime_config.current()  # empty outside an hpc job
        from_env = accelerate_settings.from_environ(os.environ)
        settings = {**from_env.values, **{k: v for k, v in config.items() if v is not None}}
        if dynamo_plugin is not None:  # code beats the job's settings
            settings.update(dynamo_plugin.as_settings())
        if dynamo_backend is not None:
            settings["dynamo_backend"] = str(getattr(dynamo_backend, "value", dynamo_backend))
        self._config = config
        kind, plugin = _choose_strategy(settings, fsdp_plugin, deepspeed_plugin)
        mode = normalize(mixed_precision or settings.get("mixed_precision"))
        steps = (gradient_accumulation_steps or getattr(plugin, "gradient_accumulation_steps", None)
                 or settings.get("gradient_accumulation_steps") or 1)
        if not isinstance(steps, int) or steps < 1:
            raise HpcError(f"gradient_accumulation_steps={steps!r} must be a whole number >= 1", fix="use 1 or more")
        self.gradient_accumulation_steps = steps
        self.handlers = _handlers(kwargs_handlers)
        cls = plugin_strategy(kind)
        cpu = cpu or bool(settings.get("use_cpu"))
        group = self.handlers.get(InitProcessGroupKwargs) or InitProcessGroupKwargs()
        if group.init_method is not None:
            raise HpcError("InitProcessGroupKwargs(init_method=...) is not used by hpc (ranks meet at MASTER_ADDR:"
                           "MASTER_PORT, env://)", fix="drop init_method")
        self._process = ProcessState.start(cpu=cpu, need_group=cls is not None and cls.needs_process_group,
                                        backend=group.backend, timeout=group.timeout)
        self.debug = bool(settings.get("debug"))  # collectives first check that every rank's shapes agree
        self._compile = Compile.from_settings(settings)
        if self.is_main_process:
            for note in from_env.notes:
                print(f"hpc: note: {note}", file=sys.stderr)
        self.strategy = choose(kind, self._process, self.handlers, plugin, mixed_precision=mode, accumulation_steps=steps)
        self.precision = Precision(mode, self._process.device, self.strategy, self.handlers.get(GradScalerKwargs),
                                   self.handlers.get(AutocastKwargs))
        self.gradient_state = GradientState(gradient_accumulation_plugin)
        self.gradient_state.sync_gradients = True
        self.project_dir = Path(project_dir or config.get("project_dir") or ".")
        self.log_with = [log_with] if isinstance(log_with, str) else list(log_with or [])
        self.seed = seed
        self.step = 0  # micro-steps seen by accumulate()
        self.training = TrainingState(before_work=self._resume_if_asked, on_progress=self._beat,
                                      on_step=self._step_completed, before_batch=self._before_batch)
        self._trigger = False  # set_trigger / check_trigger
        self._hooks = StateHooks()
        self._trackers: list = []
        self._resumed_step: int | None = None  # the step training resumed at, once it has
        setting = lambda arg, key, default: arg if arg is not None else (  # noqa: E731
            config.get(key) if config.get(key) is not None else default)
        self._auto_resume_pending = bool(setting(auto_resume, "auto_resume", False))
        self.checkpoint_async = bool(setting(checkpoint_async, "checkpoint_async", False))
        limit = self.project_configuration.total_limit  # Accelerate's name for how many checkpoints to keep
        self._checkpoint_keep = int(setting(checkpoint_keep, "checkpoint_keep", max(limit or MIN_KEEP, MIN_KEEP)))
        if limit is not None and limit < MIN_KEEP and self.is_main_process:
            print(f"hpc: note: ProjectConfiguration(total_limit={limit}): hpc keeps {MIN_KEEP} checkpoints (the "
                  "newest may be damaged by a crash mid-save; the one before it must exist)", file=sys.stderr)
        self._checkpoint_fsync = bool(setting(checkpoint_fsync, "checkpoint_fsync", False))
        self._checkpointer: Checkpointer | None = None
        self._preemption = config.get("preemption") or {}
        self._watch = preemption.PreemptionWatch(self._requeue_signals(), os.environ.get("HPC_STOP_FILE"))
        self._stop_code, self._stop_reason = 0, ""
        self._stop_vote = StopVote(self._process.distributed, self._process.backend)
        self._hang_requeue = bool(config.get("hang_requeue", False))
        # a script that resumes itself (resume_args): stopped by hpc at a batch after the warning signal, its
        # checkpoints noted for the next attempt's --resume_from_checkpoint
        self._script_resumes = bool(config.get("resume_args"))
        self._resume_save_as: str | None = config.get("resume_save_as")
        self._batch_marks: dict[int, int] = {}  # loader -> completed steps at its previous batch of this pass
        hang_timeout = config.get("hang_timeout", DEFAULT_HANG_TIMEOUT_S if config else 0)  # off outside a job
        self._watchdog = self._make_watchdog(float(hang_timeout))
        self._watchdog.start()
        self._pace = Pace(self._preemption.get("lead_time") if config.get("warns_before_limit") else None,
                          os.environ.get("HPC_JOB_DIR"), self.is_main_process)
        if config:  # inside an hpc job the warning signal starts ignored; from now on it is noted
            self._watch.install(term=False)
        from hpc.runtime import process_state as shared_state  # here: hpc.runtime.process_state imports hpc.runtime

        shared_state.attach_accelerator(self)

    # --- pickling ------------------------------------------------------------------------------------
    # An Accelerator may be pickled (sent to a worker, kept with a trainer object). What belongs to this process
    # alone (its hang watchdog thread, signal handlers, checkpoint writer, the job's pacing) is left behind; the
    # copy gets an idle watchdog and signal watch, and starts its own writer when it first saves.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for key in ("_watchdog", "_watch", "_pace", "_checkpointer"):
            state[key] = None
        state["_trackers"] = []
        state["_hooks"] = StateHooks()  # callbacks of this process
        state["_stop_vote"] = StopVote(False, None)  # its votes and group belong to this process
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._watchdog = HangWatchdog(0.0, self.process_index, self.num_processes, socket.gethostname(), None)
        self._watch = preemption.PreemptionWatch(self._requeue_signals(), None)
        self._pace = Pace(None, None, self.is_main_process)

    # --- where am I ---------------------------------------------------------------------------------
    @property
    def state(self):
        """Accelerate's AcceleratorState: this process's facts and this Accelerator's choices."""
        from hpc.runtime.process_state import AcceleratorState

        return AcceleratorState()

    @property
    def device(self) -> torch.device:
        return self._process.device

    @property
    def process_index(self) -> int:
        return self._process.env.rank

    @property
    def local_process_index(self) -> int:
        return self._process.env.local_rank

    @property
    def num_processes(self) -> int:
        return self._process.env.world_size

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def mixed_precision(self) -> str:
        return self.precision.mode

    @property
    def distributed_type(self):
        """Accelerate's DistributedType (a str enum: NO, MULTI_CPU, MULTI_GPU, FSDP, DEEPSPEED)."""
        from hpc.runtime.process_state import distributed_type_of

        return distributed_type_of(self.strategy.name, self.device, self.num_processes)

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def completed_steps(self) -> int:
        """Optimizer steps taken (accumulation windows closed). With auto_resume, before the resume has happened
        it is the step of the newest checkpoint that verifies (the one the resume will load), so `while
        accelerator.completed_steps < total:` starts where the last run stopped, never at a damaged checkpoint.
        Reading it runs no collective (a property may be read on one rank only): the rank verifies the
        checkpoint alone, as every rank reading it does, to the same answer (Checkpointer.newest_good_step).
        The resume itself happens at the next call every rank makes: iterating a prepared loader, accumulate(),
        backward(), gather(), reduce(), wait_for_everyone(), save_state(), get_state_dict(), save_model()."""
        if self._auto_resume_pending:
            newest = self.checkpointer.newest_good_step()
            return newest if newest is not None else self.training.completed_steps
        return self.training.completed_steps

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    # Accelerate's read-only facts about this run
    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def multi_device(self) -> bool:
        return self.use_distributed and self.device.type != "cpu"

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self):
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @property
    def non_blocking(self) -> bool:
        return self.dataloader_config.non_blocking

    @property
    def use_seedable_sampler(self) -> bool:
        return self.dataloader_config.use_seedable_sampler

    @property
    def use_stateful_dataloader(self) -> bool:
        return self.dataloader_config.use_stateful_dataloader

    @property
    def logging_dir(self) -> Path:
        """Where trackers write their runs: ProjectConfiguration's logging_dir, else the project folder (as in
        Accelerate); hpc's own JSONL log goes to project_dir/logs."""
        return Path(self.project_configuration.logging_dir or self.project_dir)

    @property
    def save_iteration(self) -> int:
        return self.project_configuration.iteration

    @property
    def deepspeed_plugin(self):
        return self.strategy.plugin if self.strategy.name == "deepspeed" else None

    @property
    def is_fsdp2(self) -> bool:
        return self.strategy.name == "fsdp"  # hpc's FSDP is FSDP2 (fully_shard)

    @property
    def fp8_backend(self):
        return None  # no fp8 recipe in hpc yet

    @property
    def should_save_model(self) -> bool:
        return True

    # --- prepare ----------------------------------------------------------------------------------
    def prepare(self, *objects: Any):
        """Models, optimizers, dataloaders and schedulers, in any order; returned in the same order.

        Models and optimizers of one call go to the strategy together: FSDP re-points optimizers at the
        shards, DeepSpeed builds one engine from both. Schedulers come last, to see the wrapped optimizers.
        """
        from hpc.runtime.process_state import check_not_reset

        check_not_reset(self)
        out: list[Any] = list(objects)
        loaders = [i for i, o in enumerate(objects) if isinstance(o, torch.utils.data.DataLoader)]
        models = [i for i, o in enumerate(objects) if isinstance(o, torch.nn.Module)]
        optimizers = [i for i, o in enumerate(objects) if isinstance(o, DummyOptim) or (
            isinstance(o, torch.optim.Optimizer) and not isinstance(o, AcceleratedOptimizer))]
        dummies = [o for o in objects if isinstance(o, (DummyOptim, DummyScheduler))]
        if dummies and not self.strategy.builds_optimizer_from_config:
            raise HpcError(f"{type(dummies[0]).__name__} stands for the optimizer or scheduler of a DeepSpeed config, "
                           f"and this job does not use DeepSpeed ({self.distributed_type.value})",
                           fix="build a torch optimizer and scheduler, or run with a DeepSpeed config that defines them")
        for i in loaders:
            out[i] = PreparedDataLoader(objects[i], world=self.num_processes, rank=self.process_index,
                                        device=self.device, config=self.dataloader_config, seed=self.seed,
                                        gradient_state=self.gradient_state, training=self.training)
            self.training.loaders.append(out[i])
        hints = {"micro_batch_size": next((objects[i].batch_size for i in loaders), None),
                 "scheduler": next((o for o in objects if isinstance(o, DummyScheduler)), None)}
        for i in models:
            self.precision.wrap_forward(objects[i])
        new_models, new_optimizers = self.strategy.prepare([objects[i] for i in models],
                                                           [objects[i] for i in optimizers], hints)
        for i, model in zip(models, new_models):
            out[i] = self._compile(model, self.strategy.unwrap(model))
            self.training.models.append(out[i])
        for i, opt in zip(optimizers, new_optimizers):
            out[i] = AcceleratedOptimizer(opt, self, user_optimizer=objects[i])
            self.training.optimizers.append(out[i])
        for i, o in enumerate(objects):
            if isinstance(o, torch.optim.lr_scheduler.LRScheduler):
                out[i] = self._prepare_scheduler(o)
            elif isinstance(o, DummyScheduler):  # the engine steps its own: not stepped nor saved again here
                out[i] = EngineScheduler(self.strategy.config_scheduler())
        return out[0] if len(out) == 1 else tuple(out)

    def _prepare_scheduler(self, scheduler):
        mine = [o for o in self.training.optimizers if scheduler.optimizer in (o.optimizer, o.user_optimizer)]
        wrapped = AcceleratedScheduler(scheduler, mine or self.training.optimizers, self)
        self.training.schedulers.append(wrapped)
        return wrapped

    # one kind at a time, as Accelerate spells it; the same path as prepare()
    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False):
        if device_placement is False:
            raise HpcError("prepare_model(device_placement=False) is not supported by hpc", fix="drop it")
        return self.prepare(model)

    def prepare_optimizer(self, optimizer, device_placement: bool | None = None):
        return self.prepare(optimizer)

    def prepare_scheduler(self, scheduler):
        return self.prepare(scheduler)

    def prepare_data_loader(self, data_loader, device_placement: bool | None = None, slice_fn_for_dispatch=None):
        if slice_fn_for_dispatch is not None:
            raise HpcError("prepare_data_loader(slice_fn_for_dispatch=...) is not supported by hpc (each rank is "
                           "sent its own whole batch)", fix="drop it")
        return self.prepare(data_loader)

    def register_for_checkpointing(self, *objects) -> None:
        """Objects with state_dict()/load_state_dict() saved and restored with the training state."""
        for obj in objects:
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise HpcError(f"{type(obj).__name__} cannot be checkpointed",
                               fix="give it state_dict() and load_state_dict() methods")
            self.training.custom_objects.append(obj)

    # --- the training step ------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        self._resume_if_asked()
        self.strategy.backward(loss, self.precision.scaler, **kwargs)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module):
        """One micro-step: gradients are all-reduced only at the end of a window (or of the data)."""
        self._resume_if_asked()
        plugin = self.gradient_accumulation_plugin or GradientAccumulationPlugin()
        if plugin.sync_with_dataloader and self.gradient_state.end_of_dataloader:
            self.step, sync = 0, True  # a window closes with the data, and the next epoch's starts afresh
        else:
            self.step += 1
            sync = self.step % self.gradient_accumulation_steps == 0
        self.gradient_state.sync_gradients = sync
        self.strategy.micro_step(sync)
        with contextlib.ExitStack() as stack:
            if not sync and not plugin.sync_each_batch:  # sync_each_batch: reduce every micro-batch (less memory)
                for model in models or self.training.models:
                    stack.enter_context(self.strategy.no_sync(model))
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module):
        """Inside no_sync (a manual accumulation), make the next backward all-reduce anyway (DDP only)."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            yield
            return
        before = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])  # the reducer expects this call from a forward
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = before

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables, even_batches: bool | None = None):
        """Ranks with fewer batches than others join the collectives of the ones still training (DDP's Join).
        ``even_batches`` overrides the prepared map-style loaders' setting inside the block."""
        from hpc.runtime.process_state import DistributedType

        if self.distributed_type not in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU):
            if self.distributed_type != DistributedType.NO:  # one process has nothing to join: no warning
                warnings.warn("join_uneven_inputs is only supported for multi-GPU and multi-CPU data parallelism "
                              "(DDP); it does nothing here", UserWarning, stacklevel=3)
            yield
            return
        with contextlib.ExitStack() as stack:
            if even_batches is not None:
                if any(loader.batch_sampler is None for loader in self.training.loaders):
                    warnings.warn("overriding even_batches is only supported for map-style datasets; the "
                                  "iterable ones keep their setting", UserWarning, stacklevel=3)
                for loader in self.training.loaders:
                    if loader.batch_sampler is not None:
                        stack.enter_context(loader.even_batches_as(even_batches))
            from torch.distributed.algorithms.join import Join

            stack.enter_context(Join(joinables))
            yield

    def unscale_gradients(self, optimizer=None) -> None:
        """fp16: divide the gradients by the loss scale now (once per step), e.g. to look at them."""
        for opt in ([optimizer] if optimizer is not None else self.training.optimizers):
            opt.unscale_once()

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module):
        with self.strategy.no_sync(model):
            yield

    def autocast(self, autocast_handler: AutocastKwargs | None = None):
        return self.precision.autocast(autocast_handler)

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None):
        """torch.profiler over the block, with ProfileKwargs' settings; each rank's trace in output_trace_dir."""
        handler = profile_handler or self.handlers.get(ProfileKwargs) or ProfileKwargs()
        with handler.build(self.process_index) as profiler:
            yield profiler
        if handler.output_trace_dir and not handler.schedule_option:
            folder = Path(handler.output_trace_dir)
            folder.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(folder / f"trace_rank_{self.process_index}.json"))

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2.0):
        """Unscales fp16 gradients first, once per step; a no-op on accumulation micro-steps."""
        if not self.sync_gradients:
            return None
        for opt in self.training.optimizers:
            opt.unscale_once()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters, clip_value: float) -> None:
        if not self.sync_gradients:
            return
        for opt in self.training.optimizers:
            opt.unscale_once()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(o.step_was_skipped for o in self.training.optimizers)

    # --- data and collectives ---------------------------------------------------------------------
    def skip_first_batches(self, dataloader: PreparedDataLoader, num_batches: int = 0):
        if not isinstance(dataloader, PreparedDataLoader):
            raise HpcError("skip_first_batches needs a dataloader returned by prepare()", fix="prepare it first")
        return SkipFirstBatches(dataloader, num_batches)

    def gather(self, data):
        self._resume_if_asked()
        self._vote()
        self._beat("gather")  # the label a hang report shows if the other ranks never come
        if self.debug:
            ops.verify_shapes(data, self.num_processes, "gather")
        return ops.gather(data, self.num_processes)

    def gather_for_metrics(self, data, use_gather_object: bool = False):
        """gather(), minus the samples the last batch repeated to keep ranks even. Objects that are not tensors
        (strings, lists of dicts), or use_gather_object=True, are gathered by pickling into one flat list."""
        if use_gather_object or not all_tensors(data):
            self._resume_if_asked()
            self._vote()
            self._beat("gather_object")
            items = data if isinstance(data, (list, tuple)) else [data]
            gathered = [item for part in ops.gather_object(items, self.num_processes) for item in part]
        else:
            gathered = self.gather(data)
        if self.gradient_state.remainder >= 0:
            gathered = (gathered[: self.gradient_state.remainder] if isinstance(gathered, list)
                        else ops.truncate(gathered, self.gradient_state.remainder))
        return gathered

    def set_trigger(self) -> None:
        """Raise a flag on this rank (a loss gone NaN, say) that check_trigger() then sees on every rank."""
        self._trigger = True

    def check_trigger(self) -> bool:
        """True on every rank if any rank called set_trigger() since the last check; resets it. Every rank
        must call it (one small all-reduce)."""
        flag = torch.tensor([1.0 if self._trigger else 0.0], device=self.device)
        if self._process.distributed:
            self._vote()
            self._beat("check_trigger")
            dist.all_reduce(flag)
        raised = bool(flag.item() > 0)
        if raised:
            self._trigger = False
        return raised

    def reduce(self, tensor, reduction: str = "sum", scale: float = 1.0):
        """Every tensor of the nest reduced over the ranks: summed by default, as Accelerate's Accelerator does
        (its hpc.utils.reduce means by default). ``scale`` applies on TPUs only in Accelerate: here it is
        accepted and, as there on CPUs and GPUs, not applied."""
        self._resume_if_asked()
        self._vote()
        self._beat("reduce")
        if self.debug:
            ops.verify_shapes(tensor, self.num_processes, "reduce")
        return ops.reduce(tensor, self.num_processes, reduction)

    def pad_across_processes(self, data, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
        return ops.pad_across_processes(data, self.num_processes, dim, pad_index, pad_first)

    def wait_for_everyone(self) -> None:
        self._resume_if_asked()  # every rank is here: the place to resume before a final save, say
        if self._process.distributed:
            self._vote()
            self._beat("wait_for_everyone")
            dist.barrier()

    @contextlib.contextmanager
    def main_process_first(self):
        """The main process runs the block first (e.g. downloads, caches), then the others."""
        with self._watchdog.paused("main_process_first"):  # the others wait as long as the download takes
            if not self.is_main_process:
                self.wait_for_everyone()
            yield
            if self.is_main_process:
                self.wait_for_everyone()

    # which rank runs what: PartialState's, which shares this process's state with the Accelerator
    def _partial(self):
        from hpc.runtime.process_state import PartialState

        return PartialState()

    @contextlib.contextmanager
    def local_main_process_first(self):
        with self._watchdog.paused("local_main_process_first"), self._partial().local_main_process_first():
            yield

    def on_main_process(self, function=None):
        return self._partial().on_main_process(function)

    def on_local_main_process(self, function=None):
        return self._partial().on_local_main_process(function)

    def on_last_process(self, function):
        return self._partial().on_last_process(function)

    def on_process(self, function=None, process_index: int | None = None):
        return self._partial().on_process(function, process_index=process_index)

    def on_local_process(self, function=None, local_process_index: int | None = None):
        return self._partial().on_local_process(function, local_process_index=local_process_index)

    def split_between_processes(self, inputs, apply_padding: bool = False):
        """This rank's contiguous share of a list, tuple, tensor or dict of them (padded with the last item)."""
        return self._partial().split_between_processes(inputs, apply_padding=apply_padding)

    def progress(self, iterable=None, **kwargs):
        """A tqdm progress bar on the local main process; the other ranks iterate silently."""
        from tqdm.auto import tqdm

        return tqdm(iterable, disable=not self.is_local_main_process, **kwargs)

    def print(self, *args, **kwargs) -> None:
        if self.is_local_main_process:
            print(*args, **kwargs)

    # --- checkpoints and preemption ----------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return self.project_dir / "checkpoints"

    @property
    def checkpointer(self) -> Checkpointer:
        if self._checkpointer is None:
            store = CheckpointStore(self.checkpoint_dir, self._checkpoint_keep)
            # a rank that never comes to a sharded save is named after the job's hang timeout (10 minutes without)
            arrival = float(self._config.get("hang_timeout") or 0) or 600.0
            self._checkpointer = Checkpointer(self, self.strategy.checkpoint_format(), store, self._checkpoint_fsync,
                                              arrival_timeout_s=arrival)
        return self._checkpointer

    def _training_meta(self) -> dict:
        return {"step": self.training.completed_steps, "micro_step": self.step, "strategy": self.strategy.name,
                "loaders": self.training.positions()}

    def save_state(self, output_dir: str | os.PathLike | None = None, async_save: bool | None = None) -> Path:
        """Everything training needs to go on: models, optimizers, schedulers, scaler, RNG per rank,
        registered objects, counters and dataloader positions. Default place: checkpoints/step-<N>.
        Every rank must call it. With async_save, training waits only while the state is copied."""
        self._resume_if_asked()
        with self._watchdog.paused("save_state: waiting for every rank"):
            self.checkpointer.arrive("save_state")
        folder = self._folder_named(output_dir) if output_dir is not None else self.checkpointer.store.step_dir(
            self.training.completed_steps)
        use_async = self.checkpoint_async if async_save is None else async_save
        if output_dir is not None:
            self._note_script_checkpoint(folder)
        with self._watchdog.paused("save"), contextlib.nullcontext() if use_async else self._pace.saving():
            return self.checkpointer.save(folder, self._training_meta(), async_save=use_async,
                                          purge=output_dir is None, before_write=self._run_save_hooks)

    def _note_script_checkpoint(self, folder: Path) -> None:
        """A folder the script named: where a requeued attempt of a self-resuming script may resume from, and,
        read off it, the script's naming of step checkpoints (for the one hpc saves at the warning signal)."""
        from hpc.runtime.checkpoint import script_resume as script_checkpoints

        job_dir = os.environ.get("HPC_JOB_DIR")
        if not (self._script_resumes and job_dir):
            return
        if self.is_main_process:
            script_checkpoints.note(job_dir, os.environ.get("HPC_TASK", "0"), folder, self.training.completed_steps)
        if self._resume_save_as is None:
            self._resume_save_as = script_checkpoints.naming(folder, self.training.completed_steps)

    def _before_batch(self, loader, first: bool) -> None:
        """A self-resuming script is stopped at the first batch after an optimizer step once a stop was asked
        for: its step is over, scheduler and counters included, and the checkpoint hpc saves in the script's
        naming is one its own resume arithmetic lands on. Evaluation loops take no steps and are not stopped."""
        if not self._script_resumes:
            return
        steps = self.training.completed_steps
        before = None if first else self._batch_marks.get(id(loader))
        self._batch_marks[id(loader)] = steps
        if before is None or before == steps or not self.should_stop:
            return
        # every rank is here (the stop is seen alike): rank 0's naming holds for all (diffusers saves on it alone)
        naming = self._broadcast_object(self._resume_save_as)
        folder = None
        if naming is not None:
            folder = Path(naming.replace("{step}", str(steps)))
            saved = self._broadcast_object(self.checkpointer.committed_step(folder))
            if saved != steps:  # the script's own save of this very step stands
                folder = self.save_state(folder, async_save=False)
        elif self.is_main_process:
            preemption.log("the script has saved no step checkpoint yet and resume_save_as is not set: nothing "
                           "saved; its next attempt resumes from its newest own checkpoint, if any")
        self._stop_here(folder)

    def register_save_state_pre_hook(self, hook):
        """``hook(models, weights, output_dir)`` runs on every rank before save_state writes, with the prepared
        models, their state dicts and the folder being written (e.g. to save a model in its own format beside
        the checkpoint). hpc still saves every model itself. Returns a handle whose remove() unregisters it."""
        return self._hooks.add("save", hook)

    def register_load_state_pre_hook(self, hook):
        """``hook(models, input_dir)`` runs on every rank before load_state reads the checkpoint folder. hpc
        still restores every model itself afterwards. Returns a handle whose remove() unregisters it."""
        return self._hooks.add("load", hook)

    def _models_for_hooks(self) -> list:
        """The models as Accelerate hands them to save/load hooks: under DDP the user's own module (diffusers'
        hooks call its save_pretrained), elsewhere the prepared one."""
        from torch.nn.parallel import DistributedDataParallel

        return [m.module if isinstance(m, DistributedDataParallel) else m for m in self.training.models]

    def _run_save_hooks(self, folder: Path) -> None:
        if self._hooks.save:
            models = self._models_for_hooks()
            weights = [self.strategy.unwrap(m).state_dict() for m in models]
            for hook in list(self._hooks.save.values()):
                hook(models, weights, str(folder))

    def _folder_named(self, path: str | os.PathLike) -> Path:
        """The checkpoint folder a script names. Sharded state is one folder all ranks write, so every rank takes
        rank 0's path (scripts often name one per rank: tempfile.TemporaryDirectory() on each). Replicated state
        is saved and loaded by each rank alone, with no collective (save_state may run on the main process only):
        each rank's own folder, where rank 0's holds the shared state (checkpointer.choose)."""
        return Path(path if self.checkpointer.alone else self._broadcast_object(str(path)))

    def _step_completed(self) -> None:
        """One optimizer step (an accumulation window) has ended (TrainingState counted it)."""
        self._vote()
        self._pace.step_done()
        self._watchdog.beat(f"optimizer step {self.training.completed_steps}")

    def _beat(self, what: str) -> None:
        """Progress that is not a step (a batch, a collective): the hang watchdog counts it from the first
        optimizer step on, so a long first step (torch.compile, autotuning) is not taken for a hang."""
        if self.training.completed_steps:
            self._watchdog.beat(what)

    def _make_watchdog(self, timeout_s: float) -> HangWatchdog:
        job_dir = os.environ.get("HPC_JOB_DIR")
        # one folder per array task (they share the job folder); the watchdog tells an earlier attempt's reports by age
        folder = Path(layout.JobFolder(job_dir).hang(os.environ.get("HPC_TASK", "0"))) if job_dir else None
        return HangWatchdog(timeout_s, self.process_index, self.num_processes, socket.gethostname(), folder,
                            before_exit=self._after_hang, excused=None if self.is_main_process else notices.peer_saving)

    def _after_hang(self, summary: str) -> None:
        # any rank may ask (the job script's request file is one); scontrol for a function only from the rank
        # that wrote the verdict: rank 0 may be the frozen one
        if self._hang_requeue and (preemption.job_script_requeues() or self._watchdog.wrote_summary or (
                self._watchdog.report_dir is None and self.is_main_process)):
            _, said = preemption.requeue(int(self._preemption.get("max_requeues", 3)), f"hang: {summary}")
            preemption.log(f"hang_requeue: {said}")

    def wait_for_checkpoint(self) -> None:
        """Block until a background save has committed."""
        if self._checkpointer is not None:
            with self._watchdog.paused("checkpoint commit"):
                self._checkpointer.wait()

    def load_state(self, input_dir: str | os.PathLike | None = None) -> ResumeInfo:
        """Restore a checkpoint (the given folder, or the newest good one under checkpoints/) as Accelerate does:
        models, optimizers, schedulers, scaler, RNG, registered objects and counters. Each loader goes back to
        the checkpoint's epoch (its data order) but starts it from the top, so a script that skips by itself
        (skip_first_batches) skips once; a StatefulDataLoader resumes mid-epoch, as in Accelerate. hpc's exact
        mid-epoch resume is resume() and auto_resume."""
        self._auto_resume_pending = False
        with self._watchdog.paused("load_state: waiting for every rank"):
            self.checkpointer.arrive("load_state")
        folder = self.checkpointer.choose(self._folder_named(input_dir) if input_dir is not None else None)
        if folder is None:
            raise HpcError(f"no committed checkpoint under {self.checkpoint_dir}",
                           fix="save_state() first, or name a step folder")
        return self._restore(folder, mid_epoch=False)

    def resume(self) -> ResumeInfo | None:
        """Continue from the newest good checkpoint, if there is one (a fresh start otherwise), exactly where it
        stopped: each loader goes on at the batch after the checkpoint's."""
        self._auto_resume_pending = False
        folder = self.checkpointer.choose(None)
        return self._restore(folder, mid_epoch=True) if folder is not None else None

    def _resume_if_asked(self) -> None:
        # not before prepare() has the model or optimizer: main_process_first() around dataset loading waits for
        # everyone before it, and a resume then would restore the counters and nothing else
        if self._auto_resume_pending and (self.training.models or self.training.optimizers):
            self.resume()

    def _restore(self, folder: Path, mid_epoch: bool) -> ResumeInfo:
        for hook in list(self._hooks.load.values()):
            hook(self._models_for_hooks(), str(folder))
        with self._watchdog.paused("load"):
            meta = self.checkpointer.load(folder)
        self.training.completed_steps, self.step = int(meta.get("step", 0)), int(meta.get("micro_step", 0))
        for loader, where in zip(self.training.loaders, meta.get("loaders", [])):
            if mid_epoch or loader.restores_position:
                loader.resume_at(int(where["epoch"]), int(where["position"]))
            else:  # the script skips by itself: its skip_first_batches lands where the checkpoint stopped
                loader.restart_epoch(int(where["epoch"]), checkpoint_position=int(where["position"]))
        first = (meta.get("loaders") or [{"epoch": 0, "position": 0}])[0]
        self._resumed_step = self.training.completed_steps
        for tracker in self._trackers:
            tracker.resumed_at(self.training.completed_steps)
        if self.is_main_process:
            preemption.log(f"resumed from {folder} (step {self.training.completed_steps})")
        return ResumeInfo(folder, self.training.completed_steps, int(first["epoch"]), int(first["position"]))

    def _requeue_signals(self) -> list[str]:
        # submitit asks for USR2 before the limit; its own handler would requeue at once, mid-step: once the
        # loop checks should_stop, hpc's handler takes USR2 over and stops at a step boundary with a checkpoint
        first = "USR2" if os.environ.get("SUBMITIT_EXECUTOR") else self._preemption.get("signal", "USR1")
        names = dict.fromkeys([first, self._preemption.get("signal", "USR1"), "USR2"])
        return [n for n in names if n not in ("TERM", "INT")]

    @property
    def should_stop(self) -> bool:
        """True once any rank was told to stop, the same on every rank at the same point of the loop. Reading it
        runs no collective (it may be read on one rank only): the ranks vote at each optimizer step and each
        collective they make (stop_vote.py), so a stop is seen at the first such point after the signal.
        Check it at step boundaries."""
        self._watch.install(term=True)  # from here on TERM is handled too: the loop checks for it
        code = self._stop_vote.result(self._watch.local_code())
        if code and not self._stop_code:  # what stopped us, fixed now: signals that follow (SLURM's TERM
            # after our own requeue) change nothing
            self._stop_reason = self._watch.received if self._watch.code == code else (
                "TERM on another rank" if code == preemption.STOP else "warning signal on another rank")
        self._stop_code = max(self._stop_code, code)
        return self._stop_code > 0

    def _vote(self) -> None:
        """At a point every rank reaches in the same order (a step, a collective): vote on stopping."""
        self._stop_vote.cast(self._watch.local_code())

    def preemption_point(self) -> None:
        """At a step boundary: if a stop was asked for, checkpoint, requeue (for the warning signal) and exit,
        every rank the same way. Otherwise return at once."""
        if not self.should_stop:
            return
        self._stop_here(self.save_state(async_save=False))

    def _stop_here(self, folder: Path | None) -> None:
        """Requeue (for the warning signal) and exit, every rank the same way; ``folder`` is what was saved."""
        requeued = False
        if self.is_main_process:
            # TERM is a cancel unless SLURM preempted the job
            preempted = self._stop_code == preemption.STOP and preemption.preempted_without_job_script()
            said = "exiting"
            if self._stop_code == preemption.REQUEUE or preempted:
                # a preempted job comes back whatever max_requeues says, as SLURM's own requeue would bring it
                limit = None if preempted else int(self._preemption.get("max_requeues", 3))
                requeued, said = preemption.requeue(limit, self._stop_reason)
            saved = f"saved {folder}" if folder is not None else "nothing saved"
            preemption.log(f"stop requested ({self._stop_reason}): {saved}; {said}")
        requeued = bool(self._broadcast_flag(requeued))
        self.end_training()
        sys.exit(0 if requeued else 128 + (signal.SIGTERM if self._stop_code == preemption.STOP
                                           else getattr(signal, f"SIG{self._watch.requeue_signals[0]}")))

    def _flag(self, value: int) -> torch.Tensor:
        """A one-element tensor where the backend can send it (NCCL: on the GPU)."""
        return torch.tensor([value], device=self.device if self._process.backend == "nccl" else "cpu")

    def _broadcast_object(self, value):
        if not self._process.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _broadcast_flag(self, value: bool) -> bool:
        if not self._process.distributed:
            return value
        flag = self._flag(int(value))
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    # --- models, tracking, the end ----------------------------------------------------------------
    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.strategy.unwrap(model)

    def get_state_dict(self, model: torch.nn.Module) -> dict:
        """The whole model's weights on the main process ({} on the others); every rank must call it."""
        self._resume_if_asked()  # a run with nothing left to train still hands out the resumed weights
        return self.strategy.full_state_dict(model)

    def save_model(self, model: torch.nn.Module, save_directory: str | os.PathLike, max_shard_size: int | str = "10GB",
                   safe_serialization: bool = True) -> None:
        """The whole model's weights (gathered from shards where sharded) as HuggingFace tools read them:
        model.safetensors, or shards and an index past max_shard_size (pytorch_model*.bin without
        safe_serialization). Every rank must call it; the main process writes."""
        self.wait_for_everyone()
        state = self.get_state_dict(model)
        if self.is_main_process:
            model_files.write(state, save_directory, max_shard_size, safe_serialization)
        self.wait_for_everyone()

    def save(self, obj: Any, f: str | os.PathLike, safe_serialization: bool = False) -> None:
        """Write ``obj`` once (from the main process): torch.save, or safetensors for a dict of tensors. The
        ``save_function`` transformers' save_pretrained takes."""
        if not self.is_main_process:
            return
        from hpc.runtime.checkpoint import private_temp

        with private_temp.writing(Path(f)) as tmp:
            if safe_serialization:
                from safetensors.torch import save_file

                save_file({k: v.detach().cpu().contiguous() for k, v in obj.items()}, str(tmp),
                          metadata={"format": "pt"})
            else:
                torch.save(obj, tmp)

    def free_memory(self, *objects):
        """Drop every reference the Accelerator holds (models, optimizers, schedulers, loaders) and the given
        objects', then collect: between two trainings in one process, or before a retry with a smaller batch."""
        self.wait_for_checkpoint()
        self.training.clear()
        self._checkpointer = None
        self.step = 0
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None] * len(objects)

    def init_trackers(self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None) -> None:
        """Start every tracker of ``log_with`` on the main process (JSONL always), under the project's logging
        folder; ``init_kwargs`` per tracker name go to its library (``{"wandb": {"entity": ...}}``)."""
        chosen = tracking.resolve(self.log_with)  # checked on every rank: a typo fails everywhere alike
        if not self.is_main_process:
            return
        init_kwargs = dict(init_kwargs or {})
        unknown = sorted(set(init_kwargs) - {getattr(c, "name", None) for c in chosen})
        if unknown:
            raise HpcError(f"init_kwargs for {unknown[0]!r}, which is not in log_with", fix="add it to log_with")
        for item in chosen:
            folder = self.project_dir / "logs" if item is tracking.JsonlTracker else self.logging_dir
            if isinstance(item, tracking.GeneralTracker):  # the user's own, built by the user
                item.start()
                if config:
                    item.store_init_configuration(config)
                tracker = item
            else:
                tracker = item(folder, project_name, config, **init_kwargs.get(item.name, {}))
            if self._resumed_step is not None:  # trackers started after the resume continue the run too
                tracker.resumed_at(self._resumed_step)
            self._trackers.append(tracker)

    def clear(self, *objects):
        """Accelerate's other name for free_memory."""
        return self.free_memory(*objects)

    def get_tracker(self, name: str, unwrap: bool = False):
        """The tracker started for ``name`` (its own run object with unwrap=True, e.g. the SummaryWriter); on
        the other ranks, and for a name not started, an object whose methods do nothing (as Accelerate's)."""
        for tracker in self._trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        return _NoTracker()

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """To every tracker (main process); ``log_kwargs`` per tracker name go to its library's log call."""
        log_kwargs = log_kwargs or {}
        for tracker in self._trackers:
            tracker.log(values, step, **log_kwargs.get(tracker.name, {}))

    def end_training(self) -> None:
        self._watchdog.stop()
        self.wait_for_checkpoint()
        for tracker in self._trackers:
            tracker.finish()
        self._trackers.clear()
        self._stop_vote.finish()
        if self._process.distributed and dist.is_initialized():
            # ranks tear their connections down together: a gloo rank whose peer closes while it is still
            # finishing its last collective can abort at exit
            dist.barrier()
            dist.destroy_process_group()
