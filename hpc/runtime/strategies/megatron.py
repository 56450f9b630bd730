"""Accelerate's MegatronLMPlugin: what hpc does with it.

Accelerate drives Megatron-LM's own training loop and model classes (GPT, BERT, T5 as Megatron builds them). hpc
does not: its tensor parallelism is torch's DTensor over the model's own plan (tensor_parallel.py), composed with
FSDP2, which serves any transformers model with a tp_plan. A Megatron config is therefore answered in one line
naming the ParallelismConfig that does the same (tp_degree -> tp_size, context_parallel_size -> cp_size), or what
has no counterpart (pipeline stages in training).
"""

from __future__ import annotations

from hpc.errors import HpcError


def _get(plugin, name: str, default=None):
    return plugin.get(name, default) if isinstance(plugin, dict) else getattr(plugin, name, default)


def refuse(plugin) -> None:
    tp, pp = int(_get(plugin, "tp_degree", 1) or 1), int(_get(plugin, "pp_degree", 1) or 1)
    cp = int(_get(plugin, "context_parallel_size", 1) or 1)
    sizes = ", ".join([f"{name}={n}" for name, n in (("tp_size", tp), ("cp_size", cp)) if n > 1] or ["tp_size=..."])
    if pp > 1:
        raise HpcError(f"MegatronLMPlugin(pp_degree={pp}): pipeline-parallel training runs Megatron-LM's own model "
                       "classes and loop, which hpc does not drive",
                       fix=f"use ParallelismConfig({sizes}, dp_shard_size=...) (FSDP2 shards what tensor and context "
                           "parallelism leave); for pipelined inference, prepare_pippy")
    hints = []
    if _get(plugin, "sequence_parallelism", False):
        hints.append("Megatron's sequence parallelism has no counterpart yet")
    if _get(plugin, "recompute_activations", False):
        hints.append("activation_checkpointing=True in the FSDP plugin for recompute_activations")
    raise HpcError("Accelerator(megatron_lm_plugin=...) is not driven by hpc (Megatron-LM's own model classes and "
                   "loop)", fix=f"use ParallelismConfig({sizes}, dp_shard_size=...)"
                   + (" (cp_size splits each sequence over ranks, as context_parallel_size does)" if cp > 1 else "")
                   + (f"; {'; '.join(hints)}" if hints else ""))
