"""Optimizer and scheduler wrappers: the user's loop stays plain; accumulation and fp16 skips are handled here."""

from __future__ import annotations

import torch


class AcceleratedOptimizer(torch.optim.Optimizer):
    """step/zero_grad act only at the end of an accumulation window; fp16 steps go through the scaler."""

    def __init__(self, optimizer: torch.optim.Optimizer, accelerator):
        self.optimizer, self.accelerator = optimizer, accelerator
        self.step_was_skipped = False
        self._unscaled = False

    # torch.optim.Optimizer's own attributes, read through to the real optimizer
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def unscale_once(self) -> None:
        scaler = self.accelerator.precision.scaler
        if scaler is not None and not self._unscaled:
            scaler.unscale_(self.optimizer)
            self._unscaled = True

    def zero_grad(self, set_to_none: bool = True):
        if self.accelerator.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        if not self.accelerator.sync_gradients:
            return None
        scaler = self.accelerator.precision.scaler
        self._unscaled = False
        if scaler is None:
            self.step_was_skipped = False
            return self.optimizer.step(closure)
        before = scaler.get_scale()
        scaler.step(self.optimizer)
        scaler.update()
        self.step_was_skipped = scaler.get_scale() < before  # an inf/nan gradient: no step, scale backed off
        return None

    def __repr__(self):
        return f"AcceleratedOptimizer({self.optimizer!r})"


class AcceleratedScheduler:
    """Steps once per real optimizer step: not on accumulation micro-steps, not after a skipped fp16 step."""

    def __init__(self, scheduler, optimizers: list[AcceleratedOptimizer], accelerator):
        self.scheduler, self.optimizers, self.accelerator = scheduler, optimizers, accelerator

    def step(self, *args, **kwargs):
        if not self.accelerator.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        self.scheduler.step(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.scheduler, name)

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict):
        self.scheduler.load_state_dict(state_dict)
