"""The transformers decoders the Megatron-LM layout splits into pipeline stages, and how each names and runs its parts.

A family says where the blocks are (a ModuleList the stages divide), which parts go with the first stage (the
embeddings) and which with the last (the final norm and the head), and how a stage runs its blocks on whole causal
sequences. Two families: Llama's (transformers' decoders that describe their pipeline split in
`config.base_model_pp_plan`: model.embed_tokens, model.layers, model.norm, rotary position embeddings; Llama,
Mistral, Qwen2 and kin) and GPT-2's (transformer.wte and learned positions transformer.wpe, transformer.h,
transformer.ln_f; its head tied to wte by default).

Each family also names its tensor-parallel plan (Megatron-LM's cut of its layers), what its modules need once cut
(fit_cut), and which weights the cut holds in another order than the model's (reordered), for checkpoints.
"""

from __future__ import annotations

import torch

from hpc.errors import HpcError


def _additive_causal_mask(length: int, like: torch.Tensor) -> torch.Tensor:
    # an additive causal mask: eager and sdpa attention both take it
    return torch.full((length, length), torch.finfo(like.dtype).min, device=like.device,
                      dtype=like.dtype).triu(1)[None, None]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class Llama:
    """model.embed_tokens, model.layers, model.norm, model.rotary_emb, lm_head."""

    base_name, embeddings, blocks_name, final = "model", ("embed_tokens",), "layers", ("norm",)

    @staticmethod
    def reordered():
        """None: no weight is held in another order than the model's under tensor parallelism."""
        return None

    @staticmethod
    def tp_plan(sequence_parallel: bool) -> dict:
        from hpc.runtime.parallel import tensor_parallel

        return tensor_parallel.decoder_plan(sequence_parallel)

    @staticmethod
    def fit_cut(model: torch.nn.Module, tp: int) -> None:
        """Nothing: its attention views its local q, k and v by head_dim."""

    @classmethod
    def matches(cls, model: torch.nn.Module) -> bool:
        base = getattr(model, "model", None)
        plan = getattr(getattr(model, "config", None), "base_model_pp_plan", None)
        return (isinstance(plan, dict) and base is not None and hasattr(model, "lm_head")
                and all(hasattr(base, p) for p in ("embed_tokens", "layers", "norm", "rotary_emb")))

    @staticmethod
    def embed(base, ids: torch.Tensor) -> torch.Tensor:
        return base.embed_tokens(ids)

    @staticmethod
    def run_blocks(base, hidden: torch.Tensor, length: int, layers) -> torch.Tensor:
        positions = torch.arange(length, device=hidden.device).unsqueeze(0)
        rotary = base.rotary_emb(hidden, position_ids=positions)
        mask = _additive_causal_mask(length, hidden)
        for layer in layers:
            hidden = layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
        return hidden

    @staticmethod
    def norm(base, hidden: torch.Tensor) -> torch.Tensor:
        return base.norm(hidden)


class GPT2:
    """transformer.wte, transformer.wpe, transformer.drop, transformer.h, transformer.ln_f, lm_head."""

    base_name, embeddings, blocks_name, final = "transformer", ("wte", "wpe", "drop"), "h", ("ln_f",)

    @staticmethod
    def tp_plan(sequence_parallel: bool) -> dict:
        from hpc.runtime.parallel import conv1d_parallel

        return conv1d_parallel.gpt2_plan(sequence_parallel)

    @staticmethod
    def fit_cut(model: torch.nn.Module, tp: int) -> None:
        from hpc.runtime.parallel import conv1d_parallel

        conv1d_parallel.fit_attention(model, tp)

    @staticmethod
    def reordered():
        """(the keys, the parts) of the weights held in rank-major order under tensor parallelism: the fused
        q/k/v (conv1d_parallel), which checkpoints show in the model's own order (checkpoint/column_blocks.py)."""
        from hpc.runtime.parallel import conv1d_parallel

        return conv1d_parallel.FUSED_QKV, conv1d_parallel.QKV_PARTS

    @classmethod
    def matches(cls, model: torch.nn.Module) -> bool:
        base = getattr(model, "transformer", None)
        cross = getattr(getattr(model, "config", None), "add_cross_attention", False)  # an encoder's decoder
        return (base is not None and hasattr(model, "lm_head") and not cross
                and all(hasattr(base, p) for p in ("wte", "wpe", "h", "ln_f")))

    @staticmethod
    def embed(base, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return base.drop(base.wte(ids) + base.wpe(positions))

    @staticmethod
    def run_blocks(base, hidden: torch.Tensor, length: int, layers) -> torch.Tensor:
        mask = _additive_causal_mask(length, hidden)
        for block in layers:
            hidden = block(hidden, attention_mask=mask)
        return hidden

    @staticmethod
    def norm(base, hidden: torch.Tensor) -> torch.Tensor:
        return base.ln_f(hidden)


FAMILIES = (Llama, GPT2)


def family(model: torch.nn.Module):
    """The model's family; one line where it is none hpc splits into stages."""
    for candidate in FAMILIES:
        if candidate.matches(model):
            return candidate
    raise HpcError(f"Megatron-LM layout: {type(model).__name__} is not a decoder hpc splits into stages (it runs "
                   "transformers' decoders: those with a pipeline plan, model.embed_tokens, model.layers, model.norm "
                   "and lm_head, as Llama, Mistral, Qwen2 and kin; and GPT-2)",
                   fix="use such a model, or FSDP/ParallelismConfig for other models")


def base(model: torch.nn.Module, kind=None) -> torch.nn.Module:
    return getattr(model, (kind or family(model)).base_name)


def blocks(model: torch.nn.Module, kind=None):
    return getattr(base(model, kind), (kind or family(model)).blocks_name)


def tied(model: torch.nn.Module) -> bool:
    """Whether the head's weight is the input embedding's (GPT-2 by default)."""
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = getattr(model, "lm_head", None)
    return (embedding is not None and head is not None and getattr(head, "weight", None) is not None
            and head.weight is getattr(embedding, "weight", None))


def stage_forward(self, x: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """Token ids (first stage) or hidden states -> hidden states, or logits on the last stage: installed as the
    trimmed model's forward (pipeline.trim), with ``self._hpc_family`` its family. ``chunk``: one of the rank's
    virtual stages (its blocks alone; the embeddings only in the first chunk, the head only in the last)."""
    kind = self._hpc_family
    trunk = base(self, kind)
    chunks = self._hpc_chunks
    names = [n for c in chunks for n in c] if chunk is None else chunks[chunk]
    first = getattr(trunk, kind.embeddings[0]) is not None and chunk in (None, 0)
    last = getattr(trunk, kind.final[0]) is not None and chunk in (None, len(chunks) - 1)
    if first:
        length = x.shape[1]
        hidden = _local(kind.embed(trunk, x))
    else:
        length = x.shape[1] * self._hpc_sequence_factor
        hidden = _local(x)
    blocks_now = getattr(trunk, kind.blocks_name)
    hidden = kind.run_blocks(trunk, hidden, length, [blocks_now[n] for n in names])
    if not last:
        return hidden
    return _local(self.lm_head(kind.norm(trunk, hidden)))
