"""Tensor parallelism from a model's plan: which Linear (or Embedding) is cut by columns, which by rows.

transformers models carry their plan (`model.tp_plan`, `_tp_plan`, or `config.base_model_tp_plan` for the base
model): `{"model.layers.*.self_attn.q_proj": "colwise", ...}`. transformers applies it only when it loads a model
itself (`from_pretrained(tp_plan="auto")`), and then only with no data-parallel dimension; a model built plainly
and given to prepare() gets it applied here, on the mesh's "tp" dimension, before FSDP shards the result over the
data-parallel ones. A plan may also name torch ParallelStyles directly.

Colwise layers hand their local shard on (`use_local_output`): the attention's `view(..., -1, head_dim)` then sees
its own heads, as torchtitan's Llama does. Rowwise layers all-reduce their output back to whole.
"""

from __future__ import annotations

import fnmatch

import torch

from hpc.errors import HpcError


def _styles() -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Shard(-1)),
    }


def model_plan(model: torch.nn.Module) -> dict | None:
    """The plan a transformers model carries, with full module paths; None without one."""
    for name in ("tp_plan", "_tp_plan"):
        plan = getattr(model, name, None)
        if isinstance(plan, dict) and plan:
            return dict(plan)
    config = getattr(model, "config", None)
    base = getattr(config, "base_model_tp_plan", None)
    if isinstance(base, dict) and base:
        prefix = getattr(model, "base_model_prefix", "")
        inner = prefix and isinstance(getattr(model, prefix, None), torch.nn.Module)
        return {(f"{prefix}.{k}" if inner else k): v for k, v in base.items()}
    return None


def resolve(model: torch.nn.Module, plan: dict, tp_size: int) -> dict:
    """{module path: ParallelStyle} for the modules the plan's patterns name; one line for what cannot be cut."""
    from torch.distributed.tensor.parallel import ParallelStyle

    styles, out = _styles(), {}
    modules = dict(model.named_modules())
    for pattern, style in plan.items():
        if not isinstance(style, ParallelStyle) and style not in styles:
            raise HpcError(f"tp_plan: style {style!r} (for {pattern}) is not one hpc applies",
                           fix=f"use {', '.join(styles)} or a torch ParallelStyle")
        matched = [name for name in modules if fnmatch.fnmatchcase(name, pattern)]
        for name in matched:
            _check_divides(name, modules[name], style, tp_size)
            out[name] = style if isinstance(style, ParallelStyle) else styles[style]()
    if not out:
        raise HpcError(f"tp_plan: none of its {len(plan)} patterns names a module of {type(model).__name__}",
                       fix="write the plan with the model's module paths (model.named_modules())")
    return out


def _check_divides(name: str, module: torch.nn.Module, style, tp_size: int) -> None:
    weight = getattr(module, "weight", None)
    if not isinstance(style, str) or weight is None:
        return
    dim = 1 if style.startswith("rowwise") and isinstance(module, torch.nn.Linear) else 0
    if weight.shape[dim] % tp_size:
        raise HpcError(f"tp_plan: {name}'s weight {tuple(weight.shape)} does not divide into {tp_size} along dim "
                       f"{dim} ({style})", fix=f"use a tp_size that divides {weight.shape[dim]}")


def apply(model: torch.nn.Module, mesh, plan: dict | None) -> torch.nn.Module:
    """The plan (or the model's own) applied on the 1-D tensor-parallel mesh."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = plan if plan is not None else model_plan(model)
    config = getattr(model, "config", None)
    for key in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, key, None)
        if isinstance(heads, int) and heads % mesh.size():
            raise HpcError(f"tp_size {mesh.size()} does not divide the model's {key} ({heads}): each rank must hold "
                           "whole heads", fix=f"use a tp_size that divides {heads}")
    if plan is None:
        raise HpcError(f"tp_size {mesh.size()}: {type(model).__name__} carries no tensor-parallel plan (tp_plan)",
                       fix="use a transformers model that has one, or give TorchTensorParallelPlugin(tp_plan={...})")
    return parallelize_module(model, mesh, resolve(model, plan, mesh.size()))


def applied(model: torch.nn.Module) -> bool:
    """transformers' from_pretrained(tp_plan="auto", device_mesh=accelerator.torch_device_mesh["tp"]) hands over a
    model whose weights are DTensors already: its plan is applied, not applied twice."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def decoder_plan(sequence_parallel: bool) -> dict:
    """Megatron-LM's tensor-parallel layout of a transformers decoder (model.embed_tokens, model.layers.*, model.norm,
    lm_head), as torch ParallelStyles: the embedding cut by vocabulary, attention and MLP by heads and columns, the
    head by vocabulary and gathered. With ``sequence_parallel`` the norms and the residual stream between them are
    split along the sequence over the tp ranks (torch's SequenceParallel): the row-cut layers reduce-scatter where
    they would all-reduce, and the attention and MLP all-gather their input, as Megatron-LM's sequence parallelism."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    between = Shard(1) if sequence_parallel else Replicate()  # the residual stream's layout
    plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "lm_head": ColwiseParallel(input_layouts=between, output_layouts=Replicate()),
    }
    layer = "model.layers.*."
    for name in ("q_proj", "k_proj", "v_proj"):
        plan[f"{layer}self_attn.{name}"] = ColwiseParallel()
    plan[f"{layer}self_attn.o_proj"] = RowwiseParallel(output_layouts=between)
    for name in ("gate_proj", "up_proj"):
        plan[f"{layer}mlp.{name}"] = ColwiseParallel()
    plan[f"{layer}mlp.down_proj"] = RowwiseParallel(output_layouts=between)
    if sequence_parallel:
        for name in ("input_layernorm", "post_attention_layernorm"):
            plan[f"{layer}{name}"] = SequenceParallel()
        plan["model.norm"] = SequenceParallel()
        plan[f"{layer}self_attn"] = PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                       desired_input_kwarg_layouts={"hidden_states": Replicate()})
        plan[f"{layer}mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan
