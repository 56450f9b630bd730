"""Building a model without its weights' memory: parameters are created on the meta device (or any other).

A 6B-parameter model built plainly allocates and randomly initialises 24 GB before a checkpoint overwrites it all;
built under ``init_empty_weights`` it costs nothing, and ``load_checkpoint_and_dispatch`` fills it tensor by tensor.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

_BUFFERS_ENV = "ACCELERATE_INIT_INCLUDE_BUFFERS"


def _buffers_from_env() -> bool:
    return os.environ.get(_BUFFERS_ENV, "").strip().lower() in ("1", "true", "yes", "y", "on")


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None):
    """Models built inside get every parameter (and with ``include_buffers`` every buffer) on the meta device:
    shapes and dtypes, no memory. None reads ACCELERATE_INIT_INCLUDE_BUFFERS, as Accelerate does."""
    with init_on_device(torch.device("meta"), include_buffers=include_buffers) as handle:
        yield handle


@contextlib.contextmanager
def init_on_device(device, include_buffers: bool | None = None):
    """Models built inside get every parameter (and with ``include_buffers`` every tensor made) on ``device``."""
    if include_buffers is None:
        include_buffers = _buffers_from_env()
    device = torch.device(device)
    if include_buffers:
        # torch's device context covers every factory call (buffers are made with them), not only parameters
        with device:
            yield
        return

    original = nn.Module.register_parameter

    def register_on_device(module, name, param):
        original(module, name, param)
        if param is None:
            return
        registered = module._parameters[name]
        if registered.device == device:
            return  # already there (a tied weight assigned again): a new wrapper would untie it
        # a Parameter subclass (transformers', bitsandbytes') keeps its class and its attributes
        attributes = dict(registered.__dict__)
        hf_initialized = attributes.pop("_is_hf_initialized", None)
        attributes["requires_grad"] = param.requires_grad
        moved = type(registered)(registered.to(device), **attributes)
        if hf_initialized is not None:
            moved._is_hf_initialized = hf_initialized
        module._parameters[name] = moved

    nn.Module.register_parameter = register_on_device
    try:
        yield
    finally:
        nn.Module.register_parameter = original
