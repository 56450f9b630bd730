"""Optimizer and scheduler wrappers: the user's loop stays plain; accumulation and fp16 skips are handled here."""

from __future__ import annotations

import torch


class AcceleratedOptimizer(torch.optim.Optimizer):
    """step/zero_grad act only at the end of an accumulation window; fp16 steps go through the scaler."""

    def __init__(self, optimizer: torch.optim.Optimizer, strategy, precision, gradient_state, training,
                 user_optimizer=None):
        # optimizer: what steps (the user's, or the backend's replacement); user_optimizer: what the user built.
        # The strategy steps it, through the precision's fp16 scaler; the gradient state says whether this
        # micro-step ends a window; the training state counts the steps.
        self.optimizer, self.strategy, self.precision = optimizer, strategy, precision
        self.gradient_state, self.training = gradient_state, training
        self.user_optimizer = user_optimizer if user_optimizer is not None else optimizer
        self.step_was_skipped = False
        self._unscaled = False

    # plain attributes: torch.optim.Optimizer's own (un)pickling reads `defaults`, which is the real optimizer's
    def __getstate__(self):
        return dict(self.__dict__)

    def __setstate__(self, state):
        self.__dict__.update(state)

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
        scaler = self.precision.scaler
        if scaler is not None and not self._unscaled:
            scaler.unscale_(self.optimizer)
            self._unscaled = True

    def zero_grad(self, set_to_none: bool = True):
        if self.gradient_state.sync_gradients:
            self.strategy.zero_grad(self.optimizer, set_to_none)

    def step(self, closure=None):
        if not self.gradient_state.sync_gradients:
            return None
        self._unscaled = False
        self.step_was_skipped = self.strategy.optimizer_step(self.optimizer, self.precision.scaler, closure)
        self.training.optimizer_stepped(self)
        return None

    # schedule-free optimizers switch their weights between train() and eval(): passed through
    def train(self):
        return getattr(self.optimizer, "train", lambda: None)()

    def eval(self):
        return getattr(self.optimizer, "eval", lambda: None)()

    def __repr__(self):
        return f"AcceleratedOptimizer({self.optimizer!r})"


class AcceleratedScheduler:
    """Steps as Accelerate's scheduler wrapper does, so a schedule written for Accelerate gives the same rates.

    With ``step_scheduler_with_optimizer`` (the default) it steps only after a real optimizer step (not on
    accumulation micro-steps, not after a skipped fp16 step), and then ``num_processes`` times: each rank's loader
    holds 1/world of the batches, so a schedule counted in one process's batches still ends on time. With
    ``split_batches`` the loader's batches are global ones and it steps once. Without the optimizer link every call
    steps.
    """

    def __init__(self, scheduler, optimizers: list[AcceleratedOptimizer], gradient_state, step_with_optimizer: bool,
                 repeats: int):
        # repeats: how often one step steps the schedule (num_processes, or 1 with split_batches)
        self.scheduler, self.optimizers, self.gradient_state = scheduler, optimizers, gradient_state
        self.step_with_optimizer, self.repeats = step_with_optimizer, repeats

    def step(self, *args, **kwargs):
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        repeats = self.repeats
        total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR raises past its last step
        for _ in range(repeats):
            if total is not None and self.scheduler.last_epoch + 1 > total:
                break
            self.scheduler.step(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.scheduler, name)

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict):
        self.scheduler.load_state_dict(state_dict)


def move_to_device(state, device):
    """An optimizer's state (nested lists, tuples, dicts of tensors) moved to ``device``, containers kept."""
    from hpc.runtime.process.nest import honor_type

    if isinstance(state, (list, tuple)):
        return honor_type(state, (move_to_device(t, device) for t in state))
    if isinstance(state, dict):
        return type(state)({k: move_to_device(v, device) for k, v in state.items()})
    if isinstance(state, torch.Tensor):
        return state.to(device)
    return state


def patch_optimizer_step(accelerated_optimizer, method):
    """``method`` (an optimizer's step) marking on ``accelerated_optimizer`` that it was called
    (``_accelerate_step_called``), so a skipped fp16 step can be told from a step that ran."""
    def patched_step(*args, **kwargs):
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step
