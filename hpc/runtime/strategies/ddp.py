"""Plain data parallelism (DDP), and what only DDP models do: a sync forced inside no_sync, uneven inputs joined."""

from __future__ import annotations

import contextlib
import warnings

from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

from hpc.runtime.handlers import DistributedDataParallelKwargs
from hpc.runtime.strategies.base import Strategy


class DDPStrategy(Strategy):
    """DistributedDataParallel: NCCL on CUDA, gloo on CPU; comm hooks and DDP options via kwargs handlers."""

    name = "ddp"

    def place(self, model):
        return model.to(self.state.device)

    def shard(self, model):
        kwargs = self.handlers.get(DistributedDataParallelKwargs) or DistributedDataParallelKwargs()
        device_ids = [self.state.device.index] if self.state.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **kwargs.ddp_args())
        kwargs.register_hook(wrapped)
        return wrapped

    def no_sync(self, model):
        return model.no_sync()

    def unwrap(self, model):
        return model.module if isinstance(model, DistributedDataParallel) else model


@contextlib.contextmanager
def sync_in_backward(model):
    """Inside no_sync (a manual accumulation), make the next backward all-reduce anyway (DDP only)."""
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
def join_uneven_inputs(joinables, data_parallel: bool, one_process: bool, loaders: list, even_batches: bool | None,
                       no_votes=None, stops=None):
    """Ranks with fewer batches than others join the collectives of the ones still training (DDP's Join).
    ``even_batches`` overrides the prepared map-style ``loaders``' setting inside the block; ``no_votes`` holds
    hpc's per-step collectives (stop votes, the straggler check) back while it runs (the joined ranks cannot make
    theirs); ``stops(joinables)``, a context manager, gives the joinables to join with hpc's stop vote inside the
    block (resilience/join_vote.py)."""
    if not data_parallel:
        if not one_process:  # one process has nothing to join: no warning
            warnings.warn("join_uneven_inputs is only supported for multi-GPU and multi-CPU data parallelism "
                          "(DDP); it does nothing here", UserWarning, stacklevel=3)
        yield
        return
    with contextlib.ExitStack() as stack:
        if even_batches is not None:
            if any(loader.batch_sampler is None for loader in loaders):
                warnings.warn("overriding even_batches is only supported for map-style datasets; the "
                              "iterable ones keep their setting", UserWarning, stacklevel=3)
            for loader in loaders:
                if loader.batch_sampler is not None:
                    stack.enter_context(loader.even_batches_as(even_batches))
        if no_votes is not None:
            stack.enter_context(no_votes)
        if stops is not None:
            joinables = stack.enter_context(stops(joinables))
        # torch's Join.__exit__ sets warnings.simplefilter("once") for the whole process: every warning, even the
        # ResourceWarnings Python hides, then prints, and one printed by a finalizer amid an import at exit broke
        # Python 3.11's import locks (a KeyError traceback after a clean stop). The filters are restored here.
        stack.enter_context(warnings.catch_warnings())
        stack.enter_context(Join(joinables))
        yield
