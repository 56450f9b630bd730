"""kwargs_handlers: typed settings for the pieces Accelerator builds, as Accelerate users pass them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class DistributedDataParallelKwargs:
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    bucket_cap_mb: float = 25
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: Callable | None = None  # DDP communication hook (state, bucket) -> Future
    comm_state: Any = None

    def ddp_args(self) -> dict:
        args = {"find_unused_parameters": self.find_unused_parameters, "bucket_cap_mb": self.bucket_cap_mb,
                "gradient_as_bucket_view": self.gradient_as_bucket_view, "static_graph": self.static_graph}
        if not self.broadcast_buffers:  # newer torch warns about the (default) True
            args["broadcast_buffers"] = False
        return args


@dataclass
class GradScalerKwargs:
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True
