"""GPT-2's fused q/k/v under tensor parallelism: the rank-major column order (conv1d_parallel) and the map from it
back to the model's order that checkpoints use (checkpoint/column_blocks)."""

import pytest
import torch

from hpc.runtime.checkpoint.column_blocks import blocks_to_original
from hpc.runtime.parallel.conv1d_parallel import FUSED_QKV, original_order, rank_major


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_rank_gets_its_own_heads_q_k_and_v_side_by_side(tp):
    width = 24  # q | k | v, 8 columns each
    weight = torch.arange(width).repeat(3, 1)  # column i holds i
    stored = rank_major(weight, tp)
    shard = width // tp
    for rank in range(tp):
        mine = stored[0, rank * shard:(rank + 1) * shard].tolist()
        block = 8 // tp
        expected = [part * 8 + rank * block + j for part in range(3) for j in range(block)]
        assert mine == expected
    assert torch.equal(original_order(stored, tp), weight)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("start,stop", [(0, 24), (0, 6), (3, 17), (11, 12)])
def test_a_stored_column_range_maps_to_its_columns_in_the_models_order(tp, start, stop):
    # any contiguous range of stored columns (a tp shard, or an FSDP shard of one) walks to the model's columns
    width = 24
    model = torch.arange(width)
    stored = rank_major(model, tp)
    to_original = blocks_to_original(width, tp, 3)
    at = start
    while at < stop:
        original, run = to_original(at)
        run = min(run, stop - at)
        assert run > 0
        assert stored[at:at + run].tolist() == model[original:original + run].tolist()
        at += run


def test_the_fused_layers_keys_are_found_in_model_and_flattened_optimizer_state():
    for key in ("transformer.h.0.attn.c_attn.weight", "model_0.transformer.h.3.attn.c_attn.bias",
                "optimizer_0.state.transformer.h.1.attn.c_attn.weight.exp_avg_sq"):
        assert FUSED_QKV.search(key), key
    for key in ("transformer.h.0.attn.c_proj.weight", "transformer.h.0.crossattention.c_attn.weight",
                "transformer.h.0.mlp.c_fc.weight", "optimizer_0.state.transformer.h.0.attn.c_attn_x.weight"):
        assert not FUSED_QKV.search(key), key
