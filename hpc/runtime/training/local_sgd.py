"""`accelerate.local_sgd.LocalSGD`: ranks train apart and average their weights every ``local_sgd_steps`` steps.

Inside the block the model runs without gradient all-reduces (accelerator.no_sync); step() after each optimizer
step counts, and every ``local_sgd_steps``-th one (and the block's end) sets every parameter to the ranks' mean.
Plain data parallelism only: sharded weights (FSDP, DeepSpeed) are not whole on any rank to average.
"""

from __future__ import annotations

import torch

from hpc.errors import HpcError
from hpc.runtime.process.distributed_type import DistributedType
from hpc.runtime.process.state import distributed_type_of

__all__ = ["LocalSGD"]


class LocalSGD:
    def __init__(self, accelerator, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True):
        kind = distributed_type_of(accelerator.distributed_type, accelerator.device, accelerator.num_processes)
        if kind not in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
            raise HpcError(f"LocalSGD does not work with {kind.value}: the weights are sharded",
                           fix="use plain data parallelism (no fsdp_plugin / deepspeed_plugin), or drop LocalSGD")
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise HpcError(f"LocalSGD(local_sgd_steps={local_sgd_steps!r}) must be a whole number >= 1",
                           fix="use e.g. 8")
        self.accelerator, self.model, self.local_sgd_steps = accelerator, model, local_sgd_steps
        self.enabled = enabled and kind != DistributedType.NO  # one process has nothing to average with
        self.num_steps = 0
        self._no_sync = None

    def __enter__(self) -> "LocalSGD":
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, kind, value, tb):
        if self.enabled:
            try:
                if kind is None:  # after an error another rank may never arrive at the all-reduce
                    self._average()
            finally:
                self._no_sync.__exit__(kind, value, tb)
        return False

    def step(self) -> None:
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average()

    def _average(self) -> None:
        self.accelerator.wait_for_everyone()
        with torch.no_grad():
            for param in self.model.parameters():
                param.copy_(self.accelerator.reduce(param.detach(), reduction="mean"))
