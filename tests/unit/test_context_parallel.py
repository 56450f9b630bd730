"""Context parallelism's pieces on one process: which positions each rank holds, what maybe_context_parallel
refuses, which models are refused, and the forward hooks (the split itself trains in tests/test_nd_parallel.py and
attends exactly in tests/test_context_parallel.py)."""

import pytest
import torch
import transformers

from hpc import ParallelismConfig
from hpc.errors import HpcError
from hpc.runtime.parallel.context_parallel import _checked, model_hooks, sequence_shards
from hpc.utils import TorchContextParallelConfig


def one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_each_rank_holds_a_front_and_a_back_chunk_and_together_every_position_once():
    assert sequence_shards.positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert sequence_shards.positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    for length, cp in [(16, 4), (24, 3), (8, 1)]:
        assert sorted(sequence_shards.every_rank(length, cp).tolist()) == list(range(length))
    with pytest.raises(HpcError) as e:
        sequence_shards.positions(15, 2, 0)
    assert "sequence length 15 does not cut into 2 x cp_size = 4" in one_line(e) and "multiple of 4" in one_line(e)


def test_buffers_that_are_views_of_one_sequence_split_without_overwriting_each_other():
    seq = torch.arange(17).unsqueeze(0)
    ids, labels = seq[:, :-1], seq[:, 1:]  # the usual next-token pair: one storage
    mine = sequence_shards.positions(16, 2, 1)
    want = [ids[:, mine].clone(), labels[:, mine].clone()]
    for buffer in (ids, labels):
        sequence_shards.shard_in_place(buffer, 1, mine)
    assert torch.equal(ids, want[0]) and torch.equal(labels, want[1]) and torch.equal(seq, torch.arange(17)[None])


def test_a_buffer_is_split_in_place_and_given_back_whole():
    ids = torch.arange(32).reshape(2, 16)
    original = ids.clone()
    sequence_shards.shard_in_place(ids, 1, sequence_shards.positions(16, 2, 1))
    assert ids.tolist() == [list(range(4, 12)), list(range(20, 28))]
    sequence_shards.restore_in_place(ids, original)
    assert torch.equal(ids, original)


@pytest.mark.parametrize("args,words", [
    (([], [], None), "was given no buffers"),
    (([torch.zeros(2, 8)], [1, 1], None), "1 buffers and 2 buffer_seq_dims"),
    (([[1, 2]], [0], None), "takes tensors"),
    ("same", "given twice"),
    ("stranger", "not in buffers"),
    (([torch.zeros(2, 8), torch.zeros(2, 4)], [1, 1], None), "sequence dimensions differ ([4, 8])"),
])
def test_what_maybe_context_parallel_refuses_in_one_line(args, words):
    t = torch.zeros(2, 8)
    if isinstance(args, str):
        args = {"same": ([t, t], [1, 1], None), "stranger": ([t], [1], {torch.zeros(1)})}[args]
    with pytest.raises(HpcError) as e:
        _checked(*args)
    assert words in one_line(e)


def test_accelerates_context_parallel_names_defaults_and_checks(monkeypatch):
    c = ParallelismConfig(cp_size=2, dp_shard_size=2)
    assert c.cp_backend == "torch" and c.cp_handler.cp_comm_strategy == "allgather"
    assert c.non_dp_dim_names == ["cp"] and c.dp_shard_cp_dim_names == ["dp_shard", "cp"]
    assert c.fsdp_dim_names == ["dp_shard_cp"] and c.total_size == 4
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    assert TorchContextParallelConfig().cp_comm_strategy == "alltoall"
    with pytest.raises(HpcError) as e:
        TorchContextParallelConfig("ring")
    assert "'ring' is not one" in one_line(e)
    for kwargs, words in [({"cp_backend": "deepspeed"}, "cp_backend='deepspeed'"),
                          ({"sp_size": 2}, "cannot be composed"),
                          ({"cp_handler": object()}, "is a object")]:
        with pytest.raises(HpcError) as e:
            ParallelismConfig(cp_size=2, **kwargs)
        assert words in one_line(e), kwargs


def tiny_llama(**extra):
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64, **extra)
    return transformers.LlamaForCausalLM(config).eval()


def test_models_a_split_sequence_would_train_wrong_are_refused():
    model_hooks.check(tiny_llama())  # sdpa, full attention: accepted
    with pytest.raises(HpcError) as e:
        model_hooks.check(tiny_llama(attn_implementation="eager"))
    assert "attends with 'eager'" in one_line(e) and "attn_implementation='sdpa'" in one_line(e)
    mistral = transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64, sliding_window=8))
    with pytest.raises(HpcError) as e:
        model_hooks.check(mistral)
    assert "sliding_attention layers" in one_line(e)


def test_inside_a_split_the_model_gets_its_shards_positions_and_no_mask():
    torch.manual_seed(0)
    model, forwards = tiny_llama(), model_hooks.Forwards()
    model_hooks.attach(model, forwards)
    ids = torch.randint(0, 64, (1, 8))
    mine = sequence_shards.positions(16, 2, 0)  # 0-3 and 12-15: rotary positions see the gap
    with torch.no_grad():
        plain = model(ids).logits  # outside a split: numbered from 0, the hooks do nothing
        forwards.positions = mine
        split = model(ids, attention_mask=torch.ones(1, 8)).logits
        forwards.positions = None
        told = model(ids, position_ids=mine.unsqueeze(0)).logits
    assert torch.equal(split, told) and not torch.allclose(split, plain)
    assert forwards.forwards == 1


class Wrapper(torch.nn.Module):  # a script's own wrapper (or a PEFT model): its forward names no position_ids
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        return self.model(**kwargs)


def test_a_wrapped_model_and_a_positional_none_get_the_shards_positions_too():
    torch.manual_seed(0)
    model, forwards = tiny_llama(), model_hooks.Forwards()
    wrapped = Wrapper(model)
    model_hooks.attach(wrapped, forwards)
    ids, mine = torch.randint(0, 64, (1, 8)), sequence_shards.positions(16, 2, 0)
    with torch.no_grad():
        told = model(ids, position_ids=mine.unsqueeze(0)).logits
        forwards.positions = mine
        through_wrapper = wrapped(input_ids=ids).logits
        positional_none = model(ids, None, None).logits  # input_ids, attention_mask, position_ids
        forwards.positions = None
    assert torch.equal(through_wrapper, told) and torch.equal(positional_none, told)


def test_what_the_split_would_train_wrong_at_a_forward_stops_in_one_line():
    model, forwards = tiny_llama(), model_hooks.Forwards()
    model_hooks.attach(model, forwards)
    ids = torch.randint(0, 64, (1, 8))
    forwards.positions = sequence_shards.positions(16, 2, 0)
    with pytest.raises(HpcError) as e:
        model(ids, attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]]))
    assert "attention_mask with padding" in one_line(e)
    with pytest.raises(HpcError) as e:
        model(ids, labels=ids)
    assert "labels given without shift_labels" in one_line(e) and "F.pad(labels[:, 1:]" in one_line(e)


def test_bidirectional_attention_keeps_its_own_mask_and_is_not_made_causal(monkeypatch):
    bart = transformers.BartModel(transformers.BartConfig(
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=64, max_position_embeddings=64)).eval()
    forwards, seen = model_hooks.Forwards(), []
    model_hooks.attach(bart, forwards)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: seen.append(k.get("is_causal")) or sdpa(*a, **k))
    forwards.positions = sequence_shards.positions(16, 2, 0)
    with torch.no_grad():
        bart.encoder(input_ids=torch.randint(0, 64, (1, 8)))
    assert seen == [False]
