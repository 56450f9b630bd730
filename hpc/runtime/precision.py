"""Mixed precision: fp32, bf16 (autocast), fp16 (autocast and a GradScaler that skips inf steps)."""

from __future__ import annotations

import contextlib

import torch

from hpc.errors import HpcError
from hpc.runtime.handlers import AutocastKwargs, GradScalerKwargs
from hpc.runtime.parallel import fp8

MODES = ("no", "fp32", "bf16", "fp16", "fp8")


def normalize(mode: str | None) -> str:
    """'no', 'bf16', 'fp16' or 'fp8' ('fp32' and None mean 'no')."""
    mode = (mode or "no").lower()
    if mode not in MODES:
        raise HpcError(f"mixed_precision={mode!r} is not supported", fix="use 'no', 'bf16', 'fp16' or 'fp8'")
    return "no" if mode == "fp32" else mode


class Precision:
    def __init__(self, mode: str | None, device: torch.device, strategy, scaler_kwargs: GradScalerKwargs | None = None,
                 autocast_kwargs: AutocastKwargs | None = None, handlers: dict | None = None):
        self.mode = normalize(mode)
        self.fp8_backend, self._fp8_recipe = None, None
        if self.mode == "fp8":  # matmuls in fp8 (fp8.py); weights and optimizer state stay in full precision
            handlers = handlers or {}
            self.fp8_backend = fp8.backend_of(handlers)
            fp8.check_device(device)
            self._fp8_recipe = handlers.get(fp8.AORecipeKwargs)
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

    def prepare_model(self, model: torch.nn.Module, sharded: bool) -> None:
        """Before the strategy wraps it: fp8's Linear layers (all-gathered in fp8 where ``sharded``), or autocast."""
        if self.fp8_backend is not None:
            fp8.convert(model, self._fp8_recipe, fsdp_all_gather=sharded)
        self.wrap_forward(model)

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Run the model's forward under autocast, so the user's loop needs no context of its own."""
        if self.dtype is None:
            return
        forward = model.forward

        def autocast_forward(*args, **kwargs):
            with self.autocast():
                return forward(*args, **kwargs)

        # marked, so extract_model_from_parallel(keep_fp32_wrapper=False) can take the model's own forward back
        autocast_forward.__wrapped__ = forward
        autocast_forward.hpc_autocast = True
        model.forward = autocast_forward
