"""Mixed precision: fp32, bf16 (autocast), fp16 (autocast and a GradScaler that skips inf steps)."""

from __future__ import annotations

import contextlib

import torch

from hpc.errors import HpcError
from hpc.runtime.handlers import GradScalerKwargs

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
    def __init__(self, mode: str | None, device: torch.device, strategy, scaler_kwargs: GradScalerKwargs | None = None):
        self.mode = normalize(mode)
        self.device = device
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.mode)
        self.scaler = None
        if self.mode == "fp16":
            k = scaler_kwargs or GradScalerKwargs()
            # the strategy says which scaler (sharded models agree on skips; DeepSpeed scales by itself)
            self.scaler = strategy.grad_scaler(device.type, init_scale=k.init_scale, growth_factor=k.growth_factor,
                                               backoff_factor=k.backoff_factor, growth_interval=k.growth_interval,
                                               enabled=k.enabled)

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Run the model's forward under autocast, so the user's loop needs no context of its own."""
        if self.dtype is None:
            return
        forward = model.forward

        def autocast_forward(*args, **kwargs):
            with self.autocast():
                return forward(*args, **kwargs)

        model.forward = autocast_forward
