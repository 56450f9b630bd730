"""Layerwise casting: a layer's weights are stored in a small dtype (float8, bfloat16) and cast up to the compute
dtype for its forward only, so a model takes the small dtype's memory and computes in the larger one.
"""

from __future__ import annotations

import logging
import re

import torch
from torch import nn

from hpc.errors import HpcError
from hpc.runtime.big_models.hooks import ModelHook, add_hook_to_module, compiler_disable

logger = logging.getLogger(__name__)

# the layers cast (Accelerate's list): each is one weight-holding op, so casting it whole is one cast of its weights
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                                          nn.ConvTranspose3d, nn.Linear)


class LayerwiseCastingHook(ModelHook):
    """Holds the module in ``storage_dtype``, casting it to ``compute_dtype`` for its forward and back after."""

    _is_stateful = False

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool):
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module):
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return module

    @compiler_disable
    def pre_forward(self, module, *args, **kwargs):
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    @compiler_disable
    def post_forward(self, module, output):
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def _patterns(skip_modules_pattern) -> tuple[str, ...]:
    if skip_modules_pattern is None:
        return ()
    if isinstance(skip_modules_pattern, str):
        return (skip_modules_pattern,)  # one pattern (Accelerate would read each of its characters as one)
    return tuple(skip_modules_pattern)


def attach_layerwise_casting_hooks(module: nn.Module, storage_dtype: torch.dtype, compute_dtype: torch.dtype,
                                   skip_modules_pattern=None, skip_modules_classes=None,
                                   non_blocking: bool = False) -> None:
    """A LayerwiseCastingHook on every Linear and convolution inside ``module`` (on ``module`` itself when it is
    one), except those whose name matches one of ``skip_modules_pattern`` (``re.search``) or whose class is one of
    ``skip_modules_classes`` (nothing under a skipped module is cast either)."""
    for name, dtype in (("storage_dtype", storage_dtype), ("compute_dtype", compute_dtype)):
        if not isinstance(dtype, torch.dtype):
            raise HpcError(f"attach_layerwise_casting_hooks: {name}={dtype!r} is not a torch dtype",
                           fix="pass e.g. storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16")
    patterns = _patterns(skip_modules_pattern)
    classes = tuple(skip_modules_classes) if skip_modules_classes is not None else None
    _attach(module, storage_dtype, compute_dtype, patterns, classes, non_blocking, "")


def _attach(module: nn.Module, storage_dtype, compute_dtype, patterns: tuple[str, ...], classes, non_blocking: bool,
            prefix: str) -> None:
    if (classes is not None and isinstance(module, classes)) or any(re.search(p, prefix) for p in patterns):
        logger.debug('skipping layerwise casting for "%s"', prefix)
        return
    if isinstance(module, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
        logger.debug('layerwise casting for "%s"', prefix)
        add_hook_to_module(module, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True)
        return
    for name, child in module.named_children():
        _attach(child, storage_dtype, compute_dtype, patterns, classes, non_blocking,
                f"{prefix}.{name}" if prefix else name)
