"""parallelize()'s one order, on one process: each step sees what the steps before it did (no mesh: tensor
parallelism's place is held by the multi-rank tests, tests/test_nd_parallel.py)."""

from __future__ import annotations

import torch

from hpc.runtime.parallel.parallelize import ModelSettings, parallelize


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


class _Hooks:
    def __init__(self, seen: list):
        self.seen = seen

    def prepare_model(self, model):
        self.seen.append("context_parallel")


def test_steps_run_in_the_documented_order_each_on_what_the_one_before_made():
    seen: list = []
    model = torch.nn.Sequential(_Block(), _Block())

    def shard(m):
        # activation checkpointing came before: the blocks are wrapped when the data-parallel wrap sees them
        seen.append(("shard", type(m[0]).__name__))
        return torch.nn.ModuleDict({"inner": m})

    def compile_(m, inner):
        seen.append(("compile", type(m).__name__, type(inner).__name__))
        return m

    settings = ModelSettings(precision=lambda m: seen.append("precision"), context_parallel=_Hooks(seen),
                             activation_checkpointing=True, checkpoint_layers=frozenset({"_Block"}),
                             compile=compile_)
    out = parallelize(model, None, settings, place=lambda m: seen.append("place") or m, shard=shard,
                      unwrap=lambda m: m["inner"])
    assert seen == ["precision", "place", "context_parallel", ("shard", "CheckpointWrapper"),
                    ("compile", "ModuleDict", "Sequential")]
    assert isinstance(out, torch.nn.ModuleDict)


def test_a_step_not_asked_for_is_skipped_and_the_model_comes_back_as_it_was():
    model = torch.nn.Linear(2, 2)
    assert parallelize(model, None, ModelSettings()) is model
