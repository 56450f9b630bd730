"""prepare(): models, optimizers, dataloaders and schedulers handed to the strategy, the precision and the
training state, and returned wrapped, in the order given.

Models and optimizers of one call go to the strategy together: FSDP re-points optimizers at the shards, DeepSpeed
builds one engine from both. The strategy passes each model through parallel/parallelize.py, which applies the
precision and compile given here around the strategy's own steps, in its one order. Schedulers come last, to see
the wrapped optimizers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from hpc.errors import HpcError
from hpc.runtime.configuration import DataLoaderConfiguration
from hpc.runtime.data.adapters import prepared_loader
from hpc.runtime.data.prepare import PreparedDataLoader
from hpc.runtime.parallel.compile import Compile
from hpc.runtime.parallel.parallelize import ModelSettings
from hpc.runtime.precision import Precision
from hpc.runtime.process.gradient_state import GradientState
from hpc.runtime.process.process_state import ProcessState
from hpc.runtime.process.state import distributed_type_of
from hpc.runtime.process.training_state import TrainingState
from hpc.runtime.strategies.deepspeed_dummies import DummyOptim, DummyScheduler, EngineScheduler
from hpc.runtime.training.wrappers import AcceleratedOptimizer, AcceleratedScheduler


@dataclass(eq=False)
class Preparation:
    process: ProcessState
    strategy: Any
    precision: Precision
    compile: Compile
    training: TrainingState
    gradient_state: GradientState

    def prepare(self, objects: tuple, config: DataLoaderConfiguration, seed: int,
                step_scheduler_with_optimizer: bool) -> list:
        """``config``, ``seed``, ``step_scheduler_with_optimizer``: the Accelerator's as they are now (a script
        may set another dataloader_config between two prepare() calls)."""
        out: list[Any] = list(objects)
        loaders = [i for i, o in enumerate(objects) if isinstance(o, torch.utils.data.DataLoader)]
        models = [i for i, o in enumerate(objects) if isinstance(o, torch.nn.Module)]
        optimizers = [i for i, o in enumerate(objects) if isinstance(o, DummyOptim) or (
            isinstance(o, torch.optim.Optimizer) and not isinstance(o, AcceleratedOptimizer))]
        self._refuse_dummies(objects)
        for i in loaders:
            out[i] = self._loader(objects[i], config, seed)
        hints = {"micro_batch_size": next((objects[i].batch_size for i in loaders), None),
                 "scheduler": next((o for o in objects if isinstance(o, DummyScheduler)), None)}
        sharded = self.strategy.shards_parameters  # fp8's weights all-gathered in fp8 where FSDP2 gathers them
        settings = ModelSettings(precision=lambda model: self.precision.prepare_model(model, sharded=sharded),
                                 compile=self.compile)
        new_models, new_optimizers = self.strategy.prepare([objects[i] for i in models],
                                                           [objects[i] for i in optimizers], hints, settings)
        for i, model in zip(models, new_models):
            out[i] = model
            self.training.models.append(out[i])
        for i, opt in zip(optimizers, new_optimizers):
            out[i] = AcceleratedOptimizer(opt, self.strategy, self.precision, self.gradient_state, self.training,
                                          user_optimizer=objects[i])
            self.training.optimizers.append(out[i])
        for i, o in enumerate(objects):
            if isinstance(o, torch.optim.lr_scheduler.LRScheduler):
                out[i] = self.scheduler(o, step_scheduler_with_optimizer, config.split_batches)
            elif isinstance(o, DummyScheduler):  # the engine steps its own: not stepped nor saved again here
                out[i] = EngineScheduler(self.strategy.config_scheduler())
        return out

    def _refuse_dummies(self, objects: tuple) -> None:
        dummies = [o for o in objects if isinstance(o, (DummyOptim, DummyScheduler))]
        if dummies and not self.strategy.builds_optimizer_from_config:
            kind = distributed_type_of(self.strategy.name, self.process.device, self.process.world_size)
            raise HpcError(f"{type(dummies[0]).__name__} stands for the optimizer or scheduler of a DeepSpeed config, "
                           f"and this job does not use DeepSpeed ({kind.value})",
                           fix="build a torch optimizer and scheduler, or run with a DeepSpeed config that defines "
                               "them")

    def _loader(self, loader, config: DataLoaderConfiguration, seed: int) -> PreparedDataLoader:
        world, rank = self.strategy.data_parallel()
        if world != self.process.world_size and config.dispatch_batches:
            raise HpcError("dispatch_batches with tensor or context parallelism: rank 0 would send every rank a batch "
                           "of its own, and the ranks of one tensor-parallel group need the same one",
                           fix="drop dispatch_batches (each rank then reads its data-parallel share)")
        if world != self.process.world_size and config.dispatch_batches is None:
            config = dataclasses.replace(config, dispatch_batches=False)  # each reads its data-parallel share
        # Accelerate's classes (DataLoaderShard, or DataLoaderDispatcher when rank 0 reads for all)
        prepared = prepared_loader(loader, config, world=world, rank=rank, device=self.process.device, seed=seed,
                                   gradient_state=self.gradient_state, training=self.training)
        self.training.loaders.append(prepared)
        told = getattr(self.strategy, "loader_prepared", None)  # Megatron's global_batch_size
        if told is not None:
            told(getattr(loader, "batch_size", None))
        return prepared

    def scheduler(self, scheduler, step_with_optimizer: bool, split_batches: bool) -> AcceleratedScheduler:
        mine = [o for o in self.training.optimizers if scheduler.optimizer in (o.optimizer, o.user_optimizer)]
        # Megatron's scheduler counts optimizer steps (MegatronLMDummyScheduler)
        once = split_batches or getattr(scheduler, "steps_once_per_update", False)
        repeats = 1 if once else self.process.world_size
        wrapped = AcceleratedScheduler(scheduler, mine or self.training.optimizers, self.gradient_state,
                                       step_with_optimizer, repeats)
        self.training.schedulers.append(wrapped)
        return wrapped
