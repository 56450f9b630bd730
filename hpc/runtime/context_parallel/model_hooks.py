"""What a model needs to train with its sequence split: checked once at prepare(), applied at each forward.

Context parallelism can express full causal attention over SDPA only. A model whose layers attend through another
implementation (eager, flex, flash-attn) would attend within each rank's shard alone, and a sliding-window,
chunked or linear-attention layer would lose its mask or its state: each trains wrong without failing, so each is
refused. At a forward inside maybe_context_parallel: transformers' mask is dropped for is_causal (its mask covers
the local shard, as Accelerate's hook does), and a model called without position_ids gets its shard's true
positions (left to itself it would number the shard from 0).
"""

from __future__ import annotations

import inspect

import torch

from hpc.errors import HpcError


class Forwards:
    """The context's view of the model's forwards: the positions to hand in, and whether attention ran."""

    def __init__(self):
        self.positions: torch.Tensor | None = None  # this rank's positions while a context is open
        self.forwards = 0
        self.attention_calls = 0


def check(model: torch.nn.Module) -> None:
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if config is None:
        return
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in (None, "sdpa"):
        raise HpcError(f"context parallelism: {type(model).__name__} attends with {implementation!r}, and hpc splits "
                       "the sequence inside scaled_dot_product_attention", fix="build or load the model with "
                       "attn_implementation='sdpa'")
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        other = sorted({t for t in layer_types if t != "full_attention"})
    else:  # models older than layer_types (Mistral) window every layer when sliding_window is set
        other = ["sliding_attention"] if getattr(config, "sliding_window", None) else []
    if other:
        raise HpcError(f"context parallelism: {type(model).__name__} has {', '.join(other)} layers, which a split "
                       "sequence trains wrong (their mask or state cannot cross ranks)",
                       fix="use a full-attention model, or cp_size 1")


def attach(model: torch.nn.Module, forwards: Forwards) -> None:
    order = list(inspect.signature(model.forward).parameters)
    at = order.index("position_ids") if "position_ids" in order else None

    def model_pre_hook(_module, args, kwargs):
        if forwards.positions is None:
            return None
        forwards.forwards += 1
        given = kwargs.get("position_ids") is not None or (at is not None and len(args) > at and args[at] is not None)
        if at is not None and not given:
            kwargs["position_ids"] = forwards.positions.unsqueeze(0)
        return args, kwargs

    def attention_pre_hook(_module, args, kwargs):
        if forwards.positions is not None and "attention_mask" in kwargs:
            kwargs["attention_mask"] = None
            kwargs["is_causal"] = True
        return args, kwargs

    model.register_forward_pre_hook(model_pre_hook, with_kwargs=True, prepend=True)
    for name, module in model.named_modules():
        if name.endswith("self_attn"):  # first, before any other hook reads the mask
            module.register_forward_pre_hook(attention_pre_hook, with_kwargs=True, prepend=True)
