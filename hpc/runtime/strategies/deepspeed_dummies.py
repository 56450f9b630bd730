"""DummyOptim and DummyScheduler: stand-ins for the optimizer and scheduler a DeepSpeed config defines itself.

A script builds them where it would build its own (`DummyOptim(params, lr=...)`, `DummyScheduler(optimizer,
total_num_steps=...)`) and prepare() hands back DeepSpeed's: the config's "auto" values are filled from them.
Under any other strategy there is no config to define an optimizer, and prepare() says so.
"""

from __future__ import annotations

from typing import Callable


class DummyOptim:
    def __init__(self, params, lr: float = 0.001, weight_decay: float = 0.0, **kwargs):
        self.params, self.lr, self.weight_decay, self.kwargs = params, lr, weight_decay, kwargs


class DummyScheduler:
    def __init__(self, optimizer, total_num_steps: int | None = None, warmup_num_steps: int = 0,
                 lr_scheduler_callable: Callable | None = None, **kwargs):
        self.optimizer, self.total_num_steps, self.warmup_num_steps = optimizer, total_num_steps, warmup_num_steps
        self.lr_scheduler_callable, self.kwargs = lr_scheduler_callable, kwargs


class EngineScheduler:
    """What prepare() returns for a DummyScheduler: DeepSpeed's scheduler, which its engine steps at every optimizer
    step, so the script's own lr_scheduler.step() calls change nothing."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def step(self, *args, **kwargs) -> None:
        return None

    def get_last_lr(self):
        return self.scheduler.get_last_lr()

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name):
        return getattr(self.scheduler, name)
