"""Tensor parallelism for GPT-2's layers: transformers' Conv1D (a Linear whose weight is stored (in, out)) cut by
columns or rows, and the attention's fused q/k/v layer cut by heads.

torch's ColwiseParallel and RowwiseParallel cut nn.Linear and nn.Embedding only. A Conv1D's weight is the
transpose of a Linear's, so its column cut shards the weight's dim 1 (and the bias), its row cut dim 0 (the bias
then whole, added once after the reduction); the forward is Conv1D's own, run on DTensors.

GPT-2's c_attn computes q, k and v in one Conv1D: its columns are [q | k | v], each the model's width. An even cut
of those columns would give rank 0 all of q and half of k. Here the columns are first put in rank-major order,
[q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (q_r: rank r's heads), so the even cut gives each rank its own heads' q, k and v
side by side, and the attention splits its local output in three by ``split_size`` = width / tp (set by
``fit_attention``). The weights' global order is then rank-major: ``original_order`` puts a whole tensor back, and
checkpoint/column_blocks.py shows the shards to DCP at their original places, so checkpoints keep the model's own
layout across every layout.
"""

from __future__ import annotations

import re

import torch
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

# the fused layer's weights (and their optimizer moments: "state.<name>.exp_avg") in a state dict
FUSED_QKV = re.compile(r"(^|\.)attn\.c_attn\.(weight|bias)(\.|$)")
QKV_PARTS = 3


def rank_major(t: torch.Tensor, tp: int, parts: int = QKV_PARTS) -> torch.Tensor:
    """[p0 | p1 | p2] along the last dim, each cut in ``tp`` blocks -> [p0_0 p1_0 p2_0 | p0_1 p1_1 p2_1 | ...]."""
    lead, width = t.shape[:-1], t.shape[-1]
    return t.reshape(*lead, parts, tp, width // (parts * tp)).transpose(-3, -2).reshape(*lead, width)


def original_order(t: torch.Tensor, tp: int, parts: int = QKV_PARTS) -> torch.Tensor:
    """rank_major's inverse."""
    lead, width = t.shape[:-1], t.shape[-1]
    return t.reshape(*lead, tp, parts, width // (parts * tp)).transpose(-3, -2).reshape(*lead, width)


def _conv1d(module: torch.nn.Module) -> bool:
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


class Conv1DColwise(ColwiseParallel):
    """ColwiseParallel for a Conv1D: weight Shard(1), bias Shard(0). ``fused`` > 1: its columns are that many
    parts side by side (q, k, v), put in rank-major order first."""

    def __init__(self, *, fused: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.fused = fused

    def _partition(self, name, module, device_mesh) -> None:
        tp = device_mesh.size()
        for pname, placement in (("weight", Shard(1)), ("bias", Shard(0))):
            param = getattr(module, pname, None)
            if param is None:
                continue
            data = rank_major(param.data, tp, self.fused) if self.fused > 1 else param.data
            module.register_parameter(pname, torch.nn.Parameter(
                distribute_tensor(data, device_mesh, [placement], src_data_rank=self.src_data_rank),
                requires_grad=param.requires_grad))

    def _apply(self, module: torch.nn.Module, device_mesh) -> torch.nn.Module:
        from functools import partial

        if not _conv1d(module):
            raise TypeError(f"Conv1DColwise cuts transformers' Conv1D, not {type(module).__name__}")
        return distribute_module(module, device_mesh, self._partition,
                                 partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                                 partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class Conv1DRowwise(RowwiseParallel):
    """RowwiseParallel for a Conv1D: weight Shard(0), bias whole."""

    def _partition(self, name, module, device_mesh) -> None:
        for pname, placement in (("weight", Shard(0)), ("bias", Replicate())):
            param = getattr(module, pname, None)
            if param is None:
                continue
            module.register_parameter(pname, torch.nn.Parameter(
                distribute_tensor(param.data, device_mesh, [placement], src_data_rank=self.src_data_rank),
                requires_grad=param.requires_grad))

    def _apply(self, module: torch.nn.Module, device_mesh) -> torch.nn.Module:
        from functools import partial

        if not _conv1d(module):
            raise TypeError(f"Conv1DRowwise cuts transformers' Conv1D, not {type(module).__name__}")
        self.desired_input_layouts = (Shard(-1),)
        return distribute_module(module, device_mesh, self._partition,
                                 partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                                 partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


def gpt2_plan(sequence_parallel: bool) -> dict:
    """Megatron-LM's tensor-parallel layout of GPT-2 (transformer.wte, wpe, h.*, ln_f, lm_head), as
    tensor_parallel.decoder_plan's for Llama's kin: embeddings (tokens and positions) cut by rows, attention by
    heads, MLP by columns then rows, the head by vocabulary and gathered; with ``sequence_parallel`` the norms and
    the residual stream split along the sequence."""
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    between = Shard(1) if sequence_parallel else Replicate()
    block = "transformer.h.*."
    plan = {
        # positions cut by rows like tokens: under sequence parallelism each rank's output is its own positions'
        "transformer.wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "transformer.wpe": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "lm_head": ColwiseParallel(input_layouts=between, output_layouts=Replicate()),
        f"{block}attn.c_attn": Conv1DColwise(fused=QKV_PARTS),
        f"{block}attn.c_proj": Conv1DRowwise(output_layouts=between),
        f"{block}mlp.c_fc": Conv1DColwise(),
        f"{block}mlp.c_proj": Conv1DRowwise(output_layouts=between),
    }
    if sequence_parallel:
        for name in ("ln_1", "ln_2"):
            plan[f"{block}{name}"] = SequenceParallel()
        plan["transformer.ln_f"] = SequenceParallel()
        for name in ("attn", "mlp"):  # GPT2Block passes their input by position
            plan[f"{block}{name}"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


def fit_attention(model: torch.nn.Module, tp: int) -> None:
    """Each attention splits its local q/k/v output (its own heads') in three."""
    for module in model.modules():
        if hasattr(module, "c_attn") and hasattr(module, "split_size"):
            module.split_size = module.embed_dim // tp
