"""kwargs_handlers: typed settings for the pieces Accelerator builds, as Accelerate users pass them."""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from hpc.errors import HpcError, shown


class KwargsHandler:
    """What every kwargs handler is (Accelerate's base class): Accelerator(kwargs_handlers=[...]) takes these."""

    def to_dict(self) -> dict:
        import copy

        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict:
        """The fields set to something other than the class's default (what is passed on to torch), the
        defaults read with no environment (a handler may read ACCELERATE_* variables when built)."""
        import os

        saved = os.environ.copy()
        os.environ.clear()
        try:
            defaults = self.__class__().to_dict()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return {key: value for key, value in self.to_dict().items() if defaults.get(key) != value}


class DDPCommunicationHookType(str, enum.Enum):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: float = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False  # deprecated in torch; accepted, as Accelerate does
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    # Accelerate's DDPCommunicationHookType (compress gradients to fp16/bf16, PowerSGD), or a hook of your own:
    # (state, bucket) -> Future
    comm_hook: DDPCommunicationHookType | str | Callable | None = None
    comm_wrapper: DDPCommunicationHookType | str | None = None  # fp16/bf16 around PowerSGD
    comm_state_option: dict = field(default_factory=dict)  # PowerSGDState's settings
    comm_state: Any = None  # the state a hook of your own gets

    def register_hook(self, model) -> None:
        """Install the communication hook on a DistributedDataParallel model."""
        hook = self.comm_hook
        if hook is None or hook in (DDPCommunicationHookType.NO, "no"):
            return
        if callable(hook) and not isinstance(hook, str):
            model.register_comm_hook(self.comm_state, hook)
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        kind = DDPCommunicationHookType(hook)
        wrapper = DDPCommunicationHookType(self.comm_wrapper) if self.comm_wrapper else DDPCommunicationHookType.NO
        wants_bf16 = DDPCommunicationHookType.BF16 in (kind, wrapper)
        if wants_bf16 and model.device_ids is None:  # torch's bf16 hooks exist for NCCL only
            raise HpcError("the bf16 communication hook needs GPUs with NCCL; this job runs on the CPU (gloo)",
                           fix="use DDPCommunicationHookType.FP16 on the CPU, or no hook")
        compressors = {DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
                       DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook}
        if kind in compressors:
            model.register_comm_hook(None, compressors[kind])
            return
        state = powerSGD_hook.PowerSGDState(process_group=None, **self.comm_state_option)
        hook_fn = powerSGD_hook.powerSGD_hook if kind == DDPCommunicationHookType.POWER_SGD \
            else powerSGD_hook.batched_powerSGD_hook
        if wrapper == DDPCommunicationHookType.FP16:
            hook_fn = default_hooks.fp16_compress_wrapper(hook_fn)
        elif wrapper == DDPCommunicationHookType.BF16:
            hook_fn = default_hooks.bf16_compress_wrapper(hook_fn)
        model.register_comm_hook(state, hook_fn)

    def ddp_args(self) -> dict:
        args = {"dim": self.dim, "find_unused_parameters": self.find_unused_parameters,
                "bucket_cap_mb": self.bucket_cap_mb, "gradient_as_bucket_view": self.gradient_as_bucket_view,
                "static_graph": self.static_graph}
        if not self.broadcast_buffers:  # newer torch warns about the (default) True
            args["broadcast_buffers"] = False
        return args


@dataclass
class GradScalerKwargs(KwargsHandler):
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    backend: str | None = None  # None: nccl with GPUs, gloo without (Accelerate's default names nccl)
    init_method: str | None = None  # hpc rendezvouses through MASTER_ADDR/MASTER_PORT (env://)
    timeout: timedelta | None = None  # how long a collective may wait (torch: 10 min NCCL, 30 min gloo)


@dataclass
class AutocastKwargs(KwargsHandler):
    enabled: bool = True  # False: mixed precision set, but this model's forward runs in full precision
    cache_enabled: bool | None = None


@dataclass
class ProfileKwargs(KwargsHandler):
    """accelerator.profile(): torch.profiler with these settings; traces per rank in output_trace_dir."""

    activities: list[str] | None = None  # "cpu", "cuda", "xpu"; None: cpu, and cuda where there is a GPU
    schedule_option: dict | None = None  # wait, warmup, active, repeat, skip_first (torch.profiler.schedule)
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None  # each rank writes trace_rank_<i>.json (chrome://tracing, Perfetto)

    def build(self, rank: int):
        import torch

        names = self.activities or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
        kinds = {"cpu": torch.profiler.ProfilerActivity.CPU, "cuda": torch.profiler.ProfilerActivity.CUDA}
        unknown = [a for a in names if a not in kinds]
        if unknown:
            raise HpcError(f"ProfileKwargs(activities={shown(names)}): {shown(unknown[0])} is not profiled here",
                           fix="use cpu and cuda")
        schedule = torch.profiler.schedule(**self.schedule_option) if self.schedule_option else None
        on_ready = self.on_trace_ready
        if on_ready is None and self.output_trace_dir and schedule is not None:
            folder = Path(self.output_trace_dir)

            def on_ready(prof):  # noqa: F811 - a schedule exports each active window as it ends
                folder.mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(str(folder / f"trace_rank_{rank}.json"))
        return torch.profiler.profile(activities=[kinds[a] for a in names], schedule=schedule,
                                      on_trace_ready=on_ready, record_shapes=self.record_shapes,
                                      profile_memory=self.profile_memory, with_stack=self.with_stack,
                                      with_flops=self.with_flops, with_modules=self.with_modules)

    @contextlib.contextmanager
    def profiling(self, rank: int):
        """The profiler over the block; without a schedule this rank's whole trace is written at its end."""
        with self.build(rank) as profiler:
            yield profiler
        if self.output_trace_dir and not self.schedule_option:
            folder = Path(self.output_trace_dir)
            folder.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(folder / f"trace_rank_{rank}.json"))
