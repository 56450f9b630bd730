"""Mixed precision: fp32, bf16 (autocast), fp16 (autocast and a GradScaler that skips inf steps)."""

from __future__ import annotations

import contextlib

import torch

from hpc.errors import HpcError
from hpc.runtime.handlers import AutocastKwargs, GradScalerKwargs

MODES = ("no", "fp32", "bf16", "fp16")


def normalize(mode: str | None) -> str:
    """'no', 'bf16' or 'fp16' ('fp32' and None mean 'no')."""
    mode = (mode or "no").lower()
    if mode == "fp8":
        raise HpcError("mixed_precision='fp8' is not in hpc yet (it needs an fp8 GPU, H100 or newer, and a recipe "
                       "such as Transformer Engine or torchao)", fix="use bf16")
    if mode not in MODES:
        raise HpcError(f"mixed_precision={mode!r} is not supported", fix="use 'no', 'bf16' or 'fp16'")
    return "no" if mode == "fp32" else mode


class Precision:
    def __init__(self, mode: str | None, device: torch.device, strategy, scaler_kwargs: GradScalerKwargs | None = None,
                 autocast_kwargs: AutocastKwargs | None = None):
        self.mode = normalize(mode)
        self.autocast_kwargs = autocast_kwargs or AutocastKwargs()
        self.device = device
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.mode)
        self.scaler = None
        if self.mode == "fp16":
            k = scaler_kwargs or GradScalerKwargs()
            # the strategy says which scaler (sharded models agree on skips; DeepSpeed scales by itself)
            self.scaler = strategy.grad_scaler(device.type, init_scale=k.init_scale, growth_factor=k.growth_factor,
                                               backoff_factor=k.backoff_factor, growth_interval=k.growth_interval,
                                               enabled=k.enabled)

    def autocast(self, autocast_handler: AutocastKwargs | None = None):
        handler = autocast_handler or self.autocast_kwargs
        if self.dtype is None or not handler.enabled:
            return contextlib.nullcontext()
        extra = {} if handler.cache_enabled is None else {"cache_enabled": handler.cache_enabled}
        return torch.autocast(self.device.type, dtype=self.dtype, **extra)

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Run the model's forward under autocast, so the user's loop needs no context of its own."""
        if self.dtype is None:
            return
        forward = model.forward

        def autocast_forward(*args, **kwargs):
            with self.autocast():
                return forward(*args, **kwargs)

        model.forward = autocast_forward
