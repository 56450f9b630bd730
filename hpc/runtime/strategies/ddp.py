from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from hpc.runtime.handlers import DistributedDataParallelKwargs
from hpc.runtime.strategies.base import Strategy


class DDPStrategy(Strategy):
    """DistributedDataParallel: NCCL on CUDA, gloo on CPU; comm hooks and DDP options via kwargs handlers."""

    name = "ddp"

    def wrap_model(self, model):
        kwargs = self.handlers.get(DistributedDataParallelKwargs) or DistributedDataParallelKwargs()
        model = model.to(self.state.device)
        device_ids = [self.state.device.index] if self.state.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **kwargs.ddp_args())
        kwargs.register_hook(wrapped)
        return wrapped

    def no_sync(self, model):
        return model.no_sync()

    def unwrap(self, model):
        return model.module if isinstance(model, DistributedDataParallel) else model
