"""One of 2 ranks under ParallelismConfig(cp_size=2): attention inside maybe_context_parallel against the whole
sequence's on one process, and what the split refuses. Rank 0 writes {check: result} as JSON to argv[1]."""

import json
import sys

import torch
import torch.nn.functional as F

from hpc import Accelerator, ParallelismConfig
from hpc.errors import HpcError
from hpc.runtime.parallel.context_parallel import sequence_shards


def split_against_whole(acc, heads_kv: int, causal: bool) -> float:
    """The largest difference of output and of q, k, v gradients between the split attention and the whole."""
    g = torch.Generator().manual_seed(heads_kv)
    q = torch.randn(2, 4, 16, 8, generator=g)
    k, v = torch.randn(2, heads_kv, 16, 8, generator=g), torch.randn(2, heads_kv, 16, 8, generator=g)
    weight = torch.randn(2, 4, 16, 8, generator=g)
    gqa = {"enable_gqa": True} if heads_kv != 4 else {}
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    (F.scaled_dot_product_attention(*whole, is_causal=causal, **gqa) * weight).sum().backward()
    mine = sequence_shards.positions(16, 2, acc.context_parallel_rank)
    with acc.maybe_context_parallel(buffers=[q, k, v, weight], buffer_seq_dims=[2, 2, 2, 2]):
        parts = [t.clone().requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*parts, is_causal=causal, **gqa)
        (out * weight).sum().backward()
    assert q.shape[2] == 16  # given back whole
    expected = F.scaled_dot_product_attention(*[t.detach() for t in whole], is_causal=causal, **gqa)[:, :, mine]
    diffs = [(out - expected).abs().max()]
    diffs += [(p.grad - w.grad[:, :, mine]).abs().max() for p, w in zip(parts, whole)]
    return float(torch.stack(diffs).max())


class Attending(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)

    def forward(self, ids):
        x = self.embed(ids)[:, None]
        return F.scaled_dot_product_attention(x, x, x, is_causal=True)


def refusal(acc, what: str) -> str:
    ids = torch.randint(0, 8, (2, 16))
    try:
        if what == "mask":
            q = torch.randn(1, 2, 16, 4)
            with acc.maybe_context_parallel(buffers=[q], buffer_seq_dims=[2]):
                F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
        elif what == "late backward":  # the graph holds the shards the block's end gave back
            model = acc.prepare(Attending())
            with acc.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1]):
                loss = model(ids).sum()
            acc.backward(loss)
        else:  # a model with no attention at all: it would see its shard alone
            model = acc.prepare(torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8)))
            with acc.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1]):
                model(ids).sum().backward()
    except HpcError as e:
        return str(e)
    return "accepted"


def torch_ring_cuts_as_hpc_numbers(acc) -> bool:
    """On CUDA the buffers are split by torch's context_parallel; the positions hpc hands the model must be the
    ones torch's load balancer gave this rank (checked here up to the attention, which torch runs on CUDA only)."""
    split = acc.strategy.context_parallel
    split.ring, ids = True, torch.arange(32).reshape(2, 16)
    try:
        with acc.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1]):
            expected = sequence_shards.positions(16, 2, acc.context_parallel_rank)
            return torch.equal(split.forwards.positions, expected) and torch.equal(ids[0], expected)
    finally:
        split.ring = False


def main() -> None:
    acc = Accelerator(parallelism_config=ParallelismConfig(cp_size=2))
    found = {"gqa causal": split_against_whole(acc, 2, True), "mha causal": split_against_whole(acc, 4, True),
             "mha full": split_against_whole(acc, 4, False), "mask": refusal(acc, "mask"),
             "no attention": refusal(acc, "model"), "late backward": refusal(acc, "late backward"),
             "torch's cut": torch_ring_cuts_as_hpc_numbers(acc),
             "ranks": [acc.context_parallel_rank, acc.tensor_parallel_rank]}
    ranks = acc.gather(torch.tensor([acc.context_parallel_rank])).tolist()
    if acc.is_main_process:
        found["cp ranks"] = ranks
        with open(sys.argv[1], "w") as f:
            json.dump(found, f)
    acc.end_training()


if __name__ == "__main__":
    main()
