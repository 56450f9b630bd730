"""DeepSpeed ZeRO 0-3: the engine owns backward, step and zero_grad; the user's loop stays the DDP loop.

The Accelerator's accumulation window is handed to the engine (its boundary flag), so DeepSpeed reduces
gradients exactly where DDP would; the engine scales the loss by the accumulation steps itself.
"""

from __future__ import annotations

import warnings

import torch

from hpc.errors import HpcError
from hpc.runtime.availability import import_deepspeed
from hpc.runtime.parallel.parallelize import ModelSettings, parallelize
from hpc.runtime.strategies import deepspeed_config
from hpc.runtime.strategies.base import Strategy
from hpc.runtime.strategies.deepspeed_dummies import DummyOptim
from hpc.runtime.strategies.plugins import DeepSpeedPlugin


def _cpu_adam(optimizer: torch.optim.Optimizer):
    """ZeRO-Offload steps on the CPU with DeepSpeed's own Adam; carry the user's settings over."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise HpcError(f"optimizer offload needs Adam or AdamW, not {type(optimizer).__name__}",
                       fix="use torch.optim.AdamW, or turn offload_optimizer off")
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    d = optimizer.defaults
    groups = [{k: v for k, v in g.items() if k in ("params", "lr", "betas", "eps", "weight_decay")}
              for g in optimizer.param_groups]
    return DeepSpeedCPUAdam(groups, lr=d["lr"], betas=d["betas"], eps=d["eps"], weight_decay=d["weight_decay"],
                            adamw_mode=isinstance(optimizer, torch.optim.AdamW))


class DeepSpeedStrategy(Strategy):
    name = "deepspeed"
    needs_process_group = True
    builds_optimizer_from_config = True

    def __init__(self, state, handlers, plugin: DeepSpeedPlugin | None, **settings):
        super().__init__(state, handlers, **settings)
        self.plugin = plugin or DeepSpeedPlugin()
        self.engine = None
        self._engine_optimizers: list = []  # what deepspeed.initialize returned for the optimizers prepared
        self.engine_scheduler = None
        self.config: dict | None = None
        self._warned_clip = False

    def prepare(self, models, optimizers, hints, settings: ModelSettings):
        if not models:
            if optimizers:
                raise HpcError("under DeepSpeed the optimizer is prepared together with its model",
                               fix="call accelerator.prepare(model, optimizer, ...) in one call")
            return [], []
        if self.engine is not None or len(models) > 1 or len(optimizers) > 1:
            raise HpcError("DeepSpeed trains one model with one optimizer per Accelerator",
                           fix="prepare one model and its optimizer")
        # the engine is parallelize()'s step 6: fp8 before it, compile (of the engine's module) after
        engine = parallelize(models[0], None, settings, shard=lambda model: self._engine(model, optimizers, hints),
                             unwrap=self.unwrap)
        return [engine], self._engine_optimizers

    def _engine(self, model, optimizers: list, hints: dict):
        """deepspeed.initialize over the model and the optimizer (or the config's, for a DummyOptim)."""
        deepspeed = import_deepspeed(self.state.device.type)
        self.config = deepspeed_config.build(
            self.plugin, micro_batch_size=hints.get("micro_batch_size") or 1,
            gradient_accumulation_steps=self.accumulation_steps, world_size=self.state.env.world_size,
            mixed_precision=self.mixed_precision, num_params=sum(p.numel() for p in model.parameters()))
        optimizer = optimizers[0] if optimizers else None
        extra = {}
        if isinstance(optimizer, DummyOptim):
            extra["model_parameters"] = optimizer.params
            deepspeed_config.fill_optimizer(self.config, optimizer, cpu=self.state.device.type == "cpu")
            optimizer = None
        elif optimizer is not None and self.plugin.offload_optimizer:
            optimizer = _cpu_adam(optimizer)
        scheduler = hints.get("scheduler")
        if scheduler is not None:
            deepspeed_config.fill_scheduler(self.config, scheduler)
            if "scheduler" not in self.config and scheduler.lr_scheduler_callable is not None:
                extra["lr_scheduler"] = scheduler.lr_scheduler_callable
        engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(model=model, optimizer=optimizer,
                                                                     config=self.config, dist_init_required=False,
                                                                     **extra)
        self.engine, self.engine_scheduler = engine, ds_scheduler
        self._engine_optimizers = [ds_optimizer] if optimizers else []
        return engine

    def config_scheduler(self):
        if self.engine_scheduler is None:
            raise HpcError("DummyScheduler needs a \"scheduler\" section in the DeepSpeed config (or an "
                           "lr_scheduler_callable), prepared together with its model and DummyOptim",
                           fix="add the section, or build a torch scheduler")
        return self.engine_scheduler

    def unwrap(self, model):
        return getattr(model, "module", model)

    def grad_scaler(self, device_type, **kwargs):
        return None  # the engine scales fp16 losses itself

    def micro_step(self, sync: bool) -> None:
        if self.engine is not None:
            self.engine.set_gradient_accumulation_boundary(sync)

    def backward(self, loss, scaler, **kwargs):
        self.engine.backward(loss, **kwargs)  # divides by the accumulation steps itself

    def optimizer_step(self, optimizer, scaler, closure=None) -> bool:
        self.engine.step()  # also zeroes the gradients
        return not self.engine.was_step_applied()

    def zero_grad(self, optimizer, set_to_none: bool = True) -> None:
        pass  # engine.step() did

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2.0):
        configured = self.config.get("gradient_clipping") if self.config else None
        if configured != max_norm and not self._warned_clip:
            warnings.warn(f"DeepSpeed clips inside its step with gradient_clipping={configured}; "
                          f"clip_grad_norm_({max_norm}) does not change that: set gradient_clipping instead",
                          stacklevel=3)
            self._warned_clip = True
        return None

    def checkpoint_format(self):
        from hpc.runtime.checkpoint.formats import DeepSpeedFormat

        return DeepSpeedFormat(self)

    def full_state_dict(self, model):
        if self.engine.zero_optimization_partition_weights():  # ZeRO-3: gather the shards on every rank
            state = self.engine._zero3_consolidated_16bit_state_dict()
            return state if self.state.env.rank == 0 else {}
        return self.unwrap(model).state_dict()
