"""Pipeline parallelism for training: a decoder model's blocks split evenly over the mesh's "pp" ranks, run by a
schedule of torch.distributed.pipelining (Megatron-LM's recipe on torch's own building blocks).

The model a rank keeps is the model itself, trimmed: the embeddings on the first stage, the final norm and the head
on the last, and between them this stage's blocks (a ModuleDict keyed by the blocks' own numbers). Every weight
keeps its name in the whole model, so a checkpoint written under one layout loads under another (DCP).

The stage's forward is hpc's (decoder_families.stage_forward), not the model's: the first stage takes token ids, the
others the hidden states the previous stage sent, the last returns logits. It serves the decoder families of
decoder_families.py (Llama's kin, with rotary position embeddings computed locally; GPT-2, whose head tied to its
embeddings is a copy on the last stage, its gradient summed with the first stage's); attention is causal over whole
sequences (no padding).

Under sequence parallelism the hidden states between blocks (and between stages) are the tp rank's slice of the
sequence, so the stage recomputes the full length from its slice.
"""

from __future__ import annotations

import types

import torch

from hpc.errors import HpcError
from hpc.runtime.parallel import decoder_families

SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe"}


def stage_layers(num_layers: int, stages: int, stage: int) -> range:
    """The blocks of one stage: an even split, the first stages taking one more where it does not divide."""
    if num_layers < stages:
        raise HpcError(f"pp_degree {stages} is more than the model's {num_layers} blocks",
                       fix=f"use pp_degree {num_layers} or fewer")
    base, extra = divmod(num_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def trim(model: torch.nn.Module, stage: int, stages: int) -> torch.nn.Module:
    """The model cut to one stage's parts, in place; the stage's forward installed (sequence_factor 1 for now). A
    head tied to the embeddings keeps the embeddings' weight on the last stage as its own copy (a first and a last
    stage each hold one; TiedHead keeps their gradients summed)."""
    kind = decoder_families.family(model)
    trunk = decoder_families.base(model, kind)
    all_blocks = getattr(trunk, kind.blocks_name)
    layers = stage_layers(len(all_blocks), stages, stage)
    # the same names as the ModuleList's: <base>.<blocks>.<i>
    setattr(trunk, kind.blocks_name, torch.nn.ModuleDict({str(i): all_blocks[i] for i in layers}))
    if stage != 0:
        for name in kind.embeddings:
            setattr(trunk, name, None)
    if stage != stages - 1:
        for name in kind.final:
            setattr(trunk, name, None)
        model.lm_head = None
    model._hpc_sequence_factor = 1
    model._hpc_family = kind
    model.forward = types.MethodType(decoder_families.stage_forward, model)
    return model


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' causal-LM loss: the next token's cross entropy, averaged over the tokens not -100."""
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), shifted.reshape(-1),
                                             ignore_index=-100)


class Pipeline:
    """One stage of the model on this rank and the schedule that drives all stages' micro-batches."""

    def __init__(self, model: torch.nn.Module, pp_mesh, device: torch.device, micro_batches: int,
                 schedule: str = "1f1b"):
        from torch.distributed import pipelining

        name = schedule.lower()
        if name not in SCHEDULES:
            raise HpcError(f"pipeline schedule {schedule!r} is not one hpc runs with one stage per rank",
                           fix=f"use {' or '.join(SCHEDULES)}")
        self.group, self.stages = pp_mesh.get_group(), pp_mesh.size()
        self.stage_index = pp_mesh.get_local_rank()
        self.first, self.last = self.stage_index == 0, self.stage_index == self.stages - 1
        self.micro_batches = micro_batches
        stage = pipelining.PipelineStage(model, self.stage_index, self.stages, device, group=self.group)
        self.schedule = getattr(pipelining, SCHEDULES[name])(stage, n_microbatches=micro_batches,
                                                             loss_fn=causal_lm_loss)

    def run(self, input_ids: torch.Tensor, labels: torch.Tensor, train: bool) -> tuple:
        """One batch through every stage (forward and backward when ``train``): the mean of the micro-batches'
        losses, on every stage (sent from the last), and the logits on the last stage (None elsewhere)."""
        import torch.distributed as dist

        if input_ids.shape[0] % self.micro_batches:
            raise HpcError(f"a batch of {input_ids.shape[0]} does not split into num_micro_batches "
                           f"{self.micro_batches}", fix="make the per-device batch size a multiple of it")
        losses: list = []
        args = (input_ids,) if self.first else ()
        target = labels if self.last else None
        if train:
            logits = self.schedule.step(*args, target=target, losses=losses)
        else:
            logits = self.schedule.eval(*args, target=target, losses=losses)
        loss = (torch.stack([x.detach().float() for x in losses]).mean() if self.last
                else torch.zeros((), device=input_ids.device))
        dist.broadcast(loss, group=self.group, group_src=self.stages - 1)
        return loss, (logits if self.last else None)
