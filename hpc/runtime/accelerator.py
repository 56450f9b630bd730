"""`Accelerator`: the names Accelerate users know, as a thin facade that delegates.

Settings come from settings_resolver.py; this process's facts from process/ (ProcessState, the collectives);
backends are strategies/, precision is precision.py, prepare() is training/preparation.py; resume, stop votes,
preemption, hang watch, pacing and save/load are the run guard's (resilience/run_guard.py).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import operator
import os
import sys
from pathlib import Path
from typing import Any

import torch

from hpc.errors import HpcError
from hpc.runtime import settings_resolver
from hpc.runtime.big_models.hooks import get_state_dict_offloaded_model, has_offloaded_params
from hpc.runtime.checkpoint import model_files, state_arguments
from hpc.runtime.configuration import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
from hpc.runtime.data.prepare import PreparedDataLoader, SkipFirstBatches
from hpc.runtime.handlers import AutocastKwargs, GradScalerKwargs, ProfileKwargs
from hpc.runtime.parallel.compile import TorchDynamoPlugin
from hpc.runtime.precision import Precision
from hpc.runtime.process import excepthook
from hpc.runtime.process.gradient_state import GradientState
from hpc.runtime.process.process_state import ProcessState
from hpc.runtime.process.run_collectives import RunCollectives
from hpc.runtime.process.state import (
    AcceleratorState,
    DistributedType,
    PartialState,
    attach_accelerator,
    check_not_reset,
    distributed_type_of,
)
from hpc.runtime.process.training_state import TrainingState
from hpc.runtime.resilience.run_guard import RunGuard
from hpc.runtime.resilience.training_checkpoints import ResumeInfo, TrainingCheckpoints
from hpc.runtime.strategies import choose, ddp
from hpc.runtime.strategies.plugins import DeepSpeedPlugin, FullyShardedDataParallelPlugin
from hpc.runtime.tracking.rank_logging import get_logger
from hpc.runtime.tracking.run_trackers import Trackers
from hpc.runtime.training.preparation import Preparation

__all__ = ["Accelerator", "ResumeInfo"]

_logger = get_logger(__name__)


def _read(path: str, doc: str | None = None) -> property:
    """A read-only attribute that is one of the Accelerator's parts' (``path``, dotted, from the Accelerator)."""
    return property(operator.attrgetter(path), doc=doc)


def _call(path: str, doc: str | None = None):
    """A method that is one of the Accelerator's parts' (``path``, dotted, from the Accelerator), called with the
    arguments as given."""
    get = operator.attrgetter(path)

    def method(self, *args, **kwargs):
        return get(self)(*args, **kwargs)

    method.__name__, method.__doc__ = path.rpartition(".")[2], doc
    return method


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
        arguments = {name: value for name, value in locals().items() if name != "self"}  # as given, by name
        s = settings_resolver.resolve(arguments)
        self.device_placement, self.seed, self.handlers, self.debug = device_placement, seed, s.handlers, s.debug
        self.dataloader_config, self.project_configuration = s.dataloader_config, s.project_configuration
        self.gradient_accumulation_plugin = gradient_accumulation_plugin
        self.gradient_accumulation_steps = s.accumulation_steps
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.project_dir, self.checkpoint_async = s.project_dir, s.checkpointing.async_save
        self.log_with = [log_with] if isinstance(log_with, str) else list(log_with or [])
        self._process = ProcessState.start(cpu=s.cpu, need_group=s.needs_process_group,
                                           backend=s.process_group.backend, timeout=s.process_group.timeout)
        if self.is_main_process:
            for note in s.notes:
                print(f"hpc: note: {note}", file=sys.stderr)
        self.parallelism_config = s.parallelism
        mesh_settings = {}
        if s.parallelism is not None:  # the sizes against this job's ranks, before the mesh is laid over them
            s.parallelism.fit(self._process.world_size)
            mesh_settings = {"parallelism": s.parallelism, "tp_plan": s.tp_plan}
        self.strategy = choose(s.strategy, self._process, self.handlers, s.plugin, mixed_precision=s.mixed_precision,
                               accumulation_steps=s.accumulation_steps, **mesh_settings)
        self.precision = Precision(s.mixed_precision, self.device, self.strategy, self.handlers.get(GradScalerKwargs),
                                   self.handlers.get(AutocastKwargs), self.handlers)
        # as Accelerate's: GradientState().num_steps is the accumulation however it was given
        self.gradient_state = GradientState(gradient_accumulation_plugin or GradientAccumulationPlugin(
            num_steps=s.accumulation_steps))
        self.gradient_state.sync_gradients = True
        self.training = TrainingState()
        self._trackers = Trackers()
        checkpoints = TrainingCheckpoints(self._process, self.training, self.strategy, self.precision,
                                          s.checkpointing, on_resumed=self._trackers.resumed_at)
        self._guard = RunGuard(self._process, self.training, checkpoints, s.resilience, finish=self.end_training)
        self.training.before_work, self.training.on_progress = self._guard.before_work, self._guard.beat
        self.training.on_step, self.training.before_batch = self._guard.step_completed, self._guard.before_batch
        self._collectives = RunCollectives(self._process, self.gradient_state, self._guard.before_collective,
                                           functools.partial(getattr, self, "debug"))  # not a lambda: picklable
        self._preparation = Preparation(self._process, self.strategy, self.precision, s.compile, self.training,
                                        self.gradient_state)
        attach_accelerator(self)

    # --- where am I: this process's facts are its ProcessState's (the one holder of rank, world, device) -----
    device = _read("_process.device")
    process_index = _read("_process.rank")
    local_process_index = _read("_process.local_rank")
    num_processes = _read("_process.world_size")
    is_main_process = _read("_process.script_main_process")  # Megatron-LM's layout: the last rank, as Accelerate's
    is_local_main_process = _read("_process.script_local_main_process")
    is_last_process = _read("_process.is_last_process")
    use_distributed = _read("_process.distributed")
    split_batches = _read("dataloader_config.split_batches")
    dispatch_batches = _read("dataloader_config.dispatch_batches")
    even_batches = _read("dataloader_config.even_batches")
    non_blocking = _read("dataloader_config.non_blocking")
    use_seedable_sampler = _read("dataloader_config.use_seedable_sampler")
    use_stateful_dataloader = _read("dataloader_config.use_stateful_dataloader")
    mixed_precision = _read("precision.mode")
    sync_gradients = _read("gradient_state.sync_gradients")
    save_iteration = _read("project_configuration.iteration")

    @property
    def state(self) -> AcceleratorState:
        """Accelerate's AcceleratorState: this process's facts and this Accelerator's choices."""
        return AcceleratorState()

    @property
    def torch_device_mesh(self):
        """The job's DeviceMesh under a ParallelismConfig (Accelerate's name); None without one."""
        return getattr(self.strategy, "device_mesh", None)

    @property
    def distributed_type(self) -> DistributedType:
        """Accelerate's DistributedType (a str enum: NO, MULTI_CPU, MULTI_GPU, FSDP, DEEPSPEED)."""
        return distributed_type_of(self.strategy.name, self.device, self.num_processes)

    @property
    def step(self) -> int:
        """Micro-steps seen by accumulate()."""
        return self.training.micro_step

    @step.setter
    def step(self, value: int) -> None:
        self.training.micro_step = value

    completed_steps = _read("_guard.completed_steps", doc="""Optimizer steps taken (accumulation windows closed).
        With auto_resume, before the resume has happened it is the step of the newest checkpoint that verifies
        (the one the resume will load), so `while accelerator.completed_steps < total:` starts where the last run
        stopped, never at a damaged checkpoint. Reading it runs no collective (a property may be read on one rank
        only): the rank verifies the checkpoint alone, as every rank reading it does, to the same answer
        (Checkpointer.newest_good_step). The resume itself happens at the next call every rank makes: iterating a
        prepared loader, accumulate(), backward(), gather(), reduce(), wait_for_everyone(), save_state(),
        get_state_dict(), save_model().""")

    @property
    def multi_device(self) -> bool:
        return self.use_distributed and self.device.type != "cpu"

    @property
    def logging_dir(self) -> Path:
        """Where trackers write their runs: ProjectConfiguration's logging_dir, else the project folder (as in
        Accelerate); hpc's own JSONL log goes to project_dir/logs."""
        return Path(self.project_configuration.logging_dir or self.project_dir)

    @property
    def deepspeed_plugin(self):
        return self.strategy.plugin if self.strategy.name == "deepspeed" else None

    @property
    def is_fsdp2(self) -> bool:
        return self.strategy.name == "fsdp"  # hpc's FSDP is FSDP2 (fully_shard)

    fp8_backend = _read("precision.fp8_backend", doc='The fp8 backend under mixed_precision="fp8" ("AO": torchao)')

    @property
    def should_save_model(self) -> bool:
        return True

    # this process's place along each mesh dimension (0 where it is not split), as Accelerate's
    tensor_parallel_rank = property(lambda self: self._mesh_rank("tp"))
    context_parallel_rank = property(lambda self: self._mesh_rank("cp"))
    data_parallel_rank = property(lambda self: self._mesh_rank("dp_replicate"))
    data_parallel_shard_rank = property(lambda self: self._mesh_rank("dp_shard"))

    @property
    def pipeline_parallel_rank(self) -> int:
        raise HpcError("pipeline_parallel_rank: hpc trains no pipeline stages (nor does Accelerate)",
                       fix="use tensor_parallel_rank, context_parallel_rank or data_parallel_rank")

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return self.is_fsdp2

    def deepspeed_ulysses_dl_adapter(self, dl, model):
        """Accelerate's hook for sequence parallelism's loaders: hpc refuses sp_size > 1, so the loader is kept."""
        return dl

    def _mesh_rank(self, dim: str) -> int:
        if self.parallelism_config is None:
            raise HpcError(f"the {dim} rank needs a ParallelismConfig", fix="Accelerator(parallelism_config=...)")
        return self.parallelism_config.rank_in(dim)

    # --- prepare ----------------------------------------------------------------------------------
    def prepare(self, *objects: Any):
        """Models, optimizers, dataloaders and schedulers, in any order; returned in the same order."""
        check_not_reset(self)
        out = self._preparation.prepare(objects, self.dataloader_config, self.seed,
                                        self.step_scheduler_with_optimizer)
        return out[0] if len(out) == 1 else tuple(out)

    # one kind at a time, as Accelerate spells it; the same path as prepare()
    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False):
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
        self._guard.before_work()
        self.strategy.backward(loss, self.precision.scaler, **kwargs)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module):
        """One micro-step: gradients are all-reduced only at the end of a window (or of the data)."""
        self._guard.before_work()
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

    def trigger_sync_in_backward(self, model: torch.nn.Module):
        """Inside no_sync (a manual accumulation), make the next backward all-reduce anyway (DDP only)."""
        return ddp.sync_in_backward(model)

    def join_uneven_inputs(self, joinables, even_batches: bool | None = None):
        """Ranks with fewer batches than others join the collectives of the ones still training (DDP's Join).
        ``even_batches`` overrides the prepared map-style loaders' setting inside the block."""
        kind = self.distributed_type
        return ddp.join_uneven_inputs(joinables, kind in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU),
                                      kind == DistributedType.NO, self.training.loaders, even_batches,
                                      self._guard.held_back(), self._guard.join_vote.block)

    def unscale_gradients(self, optimizer=None) -> None:
        """fp16: divide the gradients by the loss scale now (once per step), e.g. to look at them."""
        for opt in ([optimizer] if optimizer is not None else self.training.optimizers):
            opt.unscale_once()

    no_sync = _call("strategy.no_sync")

    def maybe_context_parallel(self, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
        """One step's sequences split over the mesh's cp ranks while the block runs
        (hpc.runtime.parallel.context_parallel): the buffers become this rank's part of themselves, and are given
        back whole at the end unless named in no_restore_buffers. Without cp_size > 1 it does nothing and says so
        once, as Accelerate's."""
        split = getattr(self.strategy, "context_parallel", None)
        if split is None:
            _logger.warning_once("maybe_context_parallel() does nothing without ParallelismConfig(cp_size > 1)")
            return contextlib.nullcontext()
        return split.split(buffers, buffer_seq_dims, no_restore_buffers)

    autocast = _call("precision.autocast")

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None):
        """torch.profiler over the block, with ProfileKwargs' settings; each rank's trace in output_trace_dir."""
        handler = profile_handler or self.handlers.get(ProfileKwargs) or ProfileKwargs()
        with handler.profiling(self.process_index) as profiler:
            yield profiler

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2.0):
        """Unscales fp16 gradients first, once per step; a no-op on accumulation micro-steps."""
        if not self.sync_gradients:
            return None
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters, clip_value: float) -> None:
        if not self.sync_gradients:
            return
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(o.step_was_skipped for o in self.training.optimizers)

    # --- data and collectives: each enters the run guard first (resume, stop vote, hang watch) ----------
    def skip_first_batches(self, dataloader: PreparedDataLoader, num_batches: int = 0):
        if not isinstance(dataloader, PreparedDataLoader):
            raise HpcError("skip_first_batches needs a dataloader returned by prepare()", fix="prepare it first")
        return SkipFirstBatches(dataloader, num_batches)

    gather = _call("_collectives.gather")
    gather_for_metrics = _call("_collectives.gather_for_metrics")
    set_trigger = _call("_collectives.set_trigger")
    check_trigger = _call("_collectives.check_trigger")
    reduce = _call("_collectives.reduce")
    pad_across_processes = _call("_collectives.pad_across_processes")
    wait_for_everyone = _call("_collectives.wait_for_everyone")

    @contextlib.contextmanager
    def main_process_first(self):
        """The main process runs the block first (e.g. downloads, caches), then the others."""
        with self._guard.paused("main_process_first"):  # the others wait as long as the download takes
            if not self.is_main_process:
                self.wait_for_everyone()
            yield
            if self.is_main_process:
                self.wait_for_everyone()

    # which rank runs what: PartialState's, which shares this process's state with the Accelerator
    @contextlib.contextmanager
    def local_main_process_first(self):
        with self._guard.paused("local_main_process_first"), PartialState().local_main_process_first():
            yield

    on_main_process = _call("_state.on_main_process")
    on_local_main_process = _call("_state.on_local_main_process")
    on_last_process = _call("_state.on_last_process")
    on_process = _call("_state.on_process")
    on_local_process = _call("_state.on_local_process")
    split_between_processes = _call("_state.split_between_processes")

    def progress(self, iterable=None, **kwargs):
        """A tqdm progress bar on the local main process; the other ranks iterate silently."""
        from tqdm.auto import tqdm  # tqdm only for the scripts that ask for a bar

        return tqdm(iterable, disable=not self.is_local_main_process, **kwargs)

    def print(self, *args, **kwargs) -> None:
        if self.is_local_main_process:
            print(*args, **kwargs)

    @property
    def _state(self) -> PartialState:
        return PartialState()  # every PartialState of a process shares one state: the Accelerator's

    # --- checkpoints and preemption: the run guard's ------------------------------------------------
    checkpoint_dir = _read("_guard.checkpoints.directory")
    checkpointer = _read("_guard.checkpoints.checkpointer")

    def save_state(self, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True, *,
                   async_save: bool | None = None, **save_model_func_kwargs) -> Path:
        """All training needs to go on, in checkpoints/step-<N> by default; every rank calls it. With async_save
        training waits only for the copy. Accelerate's other arguments: checkpoint/state_arguments.py."""
        state_arguments.check_save(save_model_func_kwargs, self.distributed_type == DistributedType.DEEPSPEED)
        return self._guard.save_state(output_dir, self.checkpoint_async if async_save is None else async_save)

    def register_save_state_pre_hook(self, hook):
        """``hook(models, weights, output_dir)`` runs on every rank before save_state writes, with the prepared
        models, their state dicts and the folder being written (e.g. to save a model in its own format beside
        the checkpoint). hpc still saves every model itself. Returns a handle whose remove() unregisters it."""
        return self._guard.checkpoints.hooks.add("save", hook)

    def register_load_state_pre_hook(self, hook):
        """``hook(models, input_dir)`` runs on every rank before load_state reads the checkpoint folder. hpc
        still restores every model itself afterwards. Returns a handle whose remove() unregisters it."""
        return self._guard.checkpoints.hooks.add("load", hook)

    wait_for_checkpoint = _call("_guard.wait_for_checkpoint", doc="Block until a background save has committed.")

    def load_state(self, input_dir: str | os.PathLike | None = None, load_kwargs: dict | None = None,
                   **load_model_func_kwargs) -> ResumeInfo:
        """Restore a checkpoint (the folder given, or the newest good one under checkpoints/) as Accelerate does.
        Each loader goes back to the checkpoint's epoch (its data order) from the top, so a script that skips by
        itself (skip_first_batches) skips once; a StatefulDataLoader resumes mid-epoch, as in Accelerate (hpc's
        exact resume: resume(), auto_resume). Accelerate's other arguments: checkpoint/state_arguments.py."""
        state_arguments.check_load({**(load_kwargs or {}), **load_model_func_kwargs})
        return self._guard.load_state(input_dir)

    def resume(self) -> ResumeInfo | None:
        """Continue from the newest good checkpoint, if there is one (a fresh start otherwise), exactly where it
        stopped: each loader goes on at the batch after the checkpoint's."""
        return self._guard.resume()

    should_stop = _read("_guard.should_stop", doc="""True once any rank was told to stop, the same on every rank
        at the same point of the loop. Reading it runs no collective (it may be read on one rank only): the ranks
        vote at each optimizer step and each collective they make (stop_vote.py), so a stop is seen at the first
        such point after the signal. Check it at step boundaries.""")


    preemption_point = _call("_guard.preemption_point", doc="""At a step boundary: if a stop was asked for,
        checkpoint, requeue (for the warning signal) and exit, every rank the same way. Otherwise return at once.""")

    # --- models, tracking, the end ----------------------------------------------------------------
    unwrap_model = _call("strategy.unwrap")

    def get_state_dict(self, model: torch.nn.Module) -> dict:
        """The whole model's weights on the main process ({} on the others); every rank must call it."""
        self._guard.before_work()  # a run with nothing left to train still hands out the resumed weights
        if any(has_offloaded_params(m) for m in model.modules()):  # dispatched with offload: weights on host/disk
            return get_state_dict_offloaded_model(model)
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
        if self.is_main_process:
            model_files.save_object(obj, f, safe_serialization)

    def free_memory(self, *objects):
        """Drop every reference the Accelerator holds (models, optimizers, schedulers, loaders) and the given
        objects', then collect: between two trainings in one process, or before a retry with a smaller batch."""
        self.wait_for_checkpoint()
        self.training.clear()
        self._guard.checkpoints.forget()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None] * len(objects)

    clear = _call("free_memory", doc="Accelerate's other name for free_memory.")

    def init_trackers(self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None) -> None:
        """Start every tracker of ``log_with`` on the main process (JSONL always), under the project's logging
        folder; ``init_kwargs`` per tracker name go to its library (``{"wandb": {"entity": ...}}``)."""
        self._trackers.start(self.log_with, self.is_main_process, project_name, config, init_kwargs,
                             self.project_dir / "logs", self.logging_dir)

    get_tracker = _call("_trackers.get", doc="""get_tracker(name, unwrap=False): the tracker started for ``name``
        (its own run object with unwrap=True, e.g. the SummaryWriter); on the other ranks, and for a name not
        started, an object whose methods do nothing (as Accelerate's).""")
    log = _call("_trackers.log", doc="""log(values, step=None, log_kwargs=None): to every tracker (main process);
        ``log_kwargs`` per tracker name go to its library's log call.""")

    def end_training(self) -> None:
        self._guard.end()
        self._trackers.finish()
        self._process.leave_group()
