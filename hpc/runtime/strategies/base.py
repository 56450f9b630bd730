from __future__ import annotations

import contextlib

import torch

from hpc.runtime.parallel.parallelize import ModelSettings, parallelize


class Strategy:
    """One way of spreading training over processes. The Accelerator facade calls only these methods.

    Defaults describe plain PyTorch (one process or DDP); FSDP and DeepSpeed override what they change.
    """

    name = "base"
    needs_process_group = False  # even with one process (FSDP meshes and DeepSpeed engines need one)
    builds_optimizer_from_config = False  # DummyOptim/DummyScheduler: the backend's config defines them
    shards_parameters = False  # parameters all-gathered for each forward (FSDP): fp8 gathers them in fp8

    def __init__(self, state, handlers: dict, *, mixed_precision: str = "no", accumulation_steps: int = 1):
        self.state, self.handlers = state, handlers
        self.mixed_precision, self.accumulation_steps = mixed_precision, accumulation_steps

    # --- preparing ----------------------------------------------------------------------------------
    def data_parallel(self) -> tuple[int, int]:
        """(how many distinct batches a step takes, which of them is this rank's): every rank its own, unless a
        mesh gives tensor- or context-parallel ranks the same ones."""
        return self.state.world_size, self.state.rank

    def prepare(self, models: list, optimizers: list, hints: dict,
                settings: ModelSettings) -> tuple[list, list]:
        """Wrap the models of one prepare() call; return the optimizers to use (the same, or replacements).
        ``settings``: the precision and compile each model is given by parallelize() around the strategy's steps."""
        return [self.wrap_model(m, settings) for m in models], optimizers

    def wrap_model(self, model: torch.nn.Module, settings: ModelSettings) -> torch.nn.Module:
        """The model through parallelize(), this strategy's place() and shard() its steps 2 and 6."""
        return parallelize(model, None, settings, place=self.place, shard=self.shard, unwrap=self.unwrap)

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model where its weights will live, before anything cuts or wraps it."""
        raise NotImplementedError

    def shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """The data-parallel wrap; the model as it is where there is none."""
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def config_scheduler(self):
        """The scheduler the backend's config defined (for a DummyScheduler); only DeepSpeed has one."""
        raise NotImplementedError

    def grad_scaler(self, device_type: str, **kwargs):
        """The fp16 loss scaler; None where the backend scales by itself."""
        return torch.amp.GradScaler(device_type, **kwargs)

    # --- the step -----------------------------------------------------------------------------------
    def no_sync(self, model: torch.nn.Module):
        return contextlib.nullcontext()

    def micro_step(self, sync: bool) -> None:
        """Called at the start of every accumulate() block with whether it ends a window."""

    def backward(self, loss: torch.Tensor, scaler, **kwargs) -> None:
        loss = loss / self.accumulation_steps
        (scaler.scale(loss) if scaler is not None else loss).backward(**kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler, closure=None) -> bool:
        """Step; True when the step was skipped (fp16 inf/nan)."""
        if scaler is None:
            optimizer.step(closure)
            return False
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        return scaler.get_scale() < before  # no step was taken and the scale backed off

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        optimizer.zero_grad(set_to_none=set_to_none)

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2.0):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    # --- weights out --------------------------------------------------------------------------------
    def checkpoint_format(self):
        """How save_state writes this strategy's models and optimizers (checkpoint/formats.py)."""
        from hpc.runtime.checkpoint.formats import FullFormat

        return FullFormat(self)

    def full_state_dict(self, model: torch.nn.Module) -> dict:
        """The whole model's weights on the main process (every rank must call it); {} elsewhere."""
        return self.unwrap(model).state_dict()


class SingleProcess(Strategy):
    name = "single"

    def place(self, model):
        return model.to(self.state.device)
