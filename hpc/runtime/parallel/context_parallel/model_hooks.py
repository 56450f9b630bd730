"""What a model needs to train with its sequence split: checked once at prepare(), applied at each forward.

Context parallelism can express full causal attention over SDPA only. A model whose layers attend through another
implementation (eager, flex, flash-attn) would attend within each rank's shard alone, and a sliding-window,
chunked or linear-attention layer would lose its mask or its state: each trains wrong without failing, so each is
refused. At a forward inside maybe_context_parallel: transformers' causal mask is dropped for is_causal (it covers
the local shard, as Accelerate's hook does; a padding mask is refused, bidirectional layers keep theirs), a model
called without position_ids gets its shard's true positions (left to itself it would number the shard from 0), and
a causal LM's labels without shift_labels are refused (it would shift them within the shard's chunks).
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
    """The model's own forward is counted and checked; it and every module whose forward takes position_ids (the
    transformers model inside a wrapper or a PEFT model) get the shard's positions where called without them."""
    model.register_forward_pre_hook(_forward_hook(model, forwards, counts=True), with_kwargs=True, prepend=True)
    for name, module in model.named_modules():
        if module is not model and _position_index(module) is not None:
            module.register_forward_pre_hook(_forward_hook(module, forwards, counts=False), with_kwargs=True,
                                             prepend=True)
        if name.endswith("self_attn") and getattr(module, "is_causal", True) is not False:
            # first, before any other hook reads the mask; bidirectional layers (encoders) keep theirs
            module.register_forward_pre_hook(_attention_hook(forwards), with_kwargs=True, prepend=True)


def _position_index(module: torch.nn.Module) -> int | None:
    order = list(inspect.signature(module.forward).parameters)
    return order.index("position_ids") if "position_ids" in order else None


def _forward_hook(module: torch.nn.Module, forwards: Forwards, counts: bool):
    at = _position_index(module)
    causal_lm = type(module).__name__.endswith("ForCausalLM")

    def hook(_module, args, kwargs):
        if forwards.positions is None:
            return None
        forwards.forwards += counts
        _refuse_padding(kwargs.get("attention_mask"))
        if causal_lm and kwargs.get("labels") is not None and kwargs.get("shift_labels") is None:
            raise HpcError("context parallelism: labels given without shift_labels, so the model would shift them "
                           "within this rank's chunks of the sequence (a wrong label at each chunk's end)",
                           fix="pass shift_labels=F.pad(labels[:, 1:], (0, 1), value=-100), made before the split "
                               "and split with it, as Accelerate's example does")
        if at is None:
            return None
        if len(args) > at:  # given in its place: filled there when None
            if args[at] is None:
                args = (*args[:at], forwards.positions.unsqueeze(0), *args[at + 1:])
        elif kwargs.get("position_ids") is None:
            kwargs["position_ids"] = forwards.positions.unsqueeze(0)
        return args, kwargs

    return hook


def _refuse_padding(mask) -> None:
    """A padding mask cannot survive the split (it is dropped for is_causal): padded sequences would attend to
    their pads."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.bool().all()):
        raise HpcError("context parallelism: an attention_mask with padding reached the model, and the split can "
                       "only express full causal attention (the pads would be attended to)",
                       fix="train on unpadded (packed) sequences of one length, or pass no attention_mask")


def _attention_hook(forwards: Forwards):
    def hook(_module, args, kwargs):
        if forwards.positions is not None and "attention_mask" in kwargs:
            kwargs["attention_mask"] = None  # transformers' causal mask over the local shard: is_causal says it
            kwargs["is_causal"] = True
        return args, kwargs

    return hook
