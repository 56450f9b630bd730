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

With virtual stages (Megatron-LM's interleaving) a rank keeps the blocks of several stages, looped (rank r: stages
r, r + pp, ...), still one model; each stage of the multi-stage schedule is a _Chunk, the model's own forward on that
chunk's blocks, so whatever wraps the model (FSDP2's gathering) runs as for one stage.
"""

from __future__ import annotations

import types

import torch

from hpc.errors import HpcError
from hpc.runtime.parallel import decoder_families

# hpc's name: (torch's class, whether it runs several (virtual) stages per rank)
SCHEDULES = {"1f1b": ("Schedule1F1B", False), "gpipe": ("ScheduleGPipe", False),
             "interleaved_1f1b": ("ScheduleInterleaved1F1B", True), "looped_bfs": ("ScheduleLoopedBFS", True)}


def rank_stages(stage: int, stages: int, virtual: int) -> list[int]:
    """The (virtual) stages a pipeline rank runs, looped as Megatron-LM's interleaving: rank r holds stages r,
    r + pp, r + 2 pp, ... of pp x virtual."""
    return [stage + i * stages for i in range(virtual)]


def stage_layers(num_layers: int, stages: int, stage: int) -> range:
    """The blocks of one stage: an even split, the first stages taking one more where it does not divide."""
    if num_layers < stages:
        raise HpcError(f"pp_degree {stages} is more than the model's {num_layers} blocks",
                       fix=f"use pp_degree {num_layers} or fewer")
    base, extra = divmod(num_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def trim(model: torch.nn.Module, stage: int, stages: int, virtual: int = 1) -> torch.nn.Module:
    """The model cut to one pipeline rank's parts, in place; the stage's forward installed (sequence_factor 1 for
    now). With ``virtual`` > 1 the rank keeps the blocks of each of its virtual stages (rank_stages), in chunks the
    forward runs one at a time (``chunk``). A head tied to the embeddings keeps the embeddings' weight on the last
    stage as its own copy (a first and a last stage each hold one; TiedHead keeps their gradients summed)."""
    kind = decoder_families.family(model)
    trunk = decoder_families.base(model, kind)
    all_blocks = getattr(trunk, kind.blocks_name)
    chunks = [stage_layers(len(all_blocks), stages * virtual, s) for s in rank_stages(stage, stages, virtual)]
    # the same names as the ModuleList's: <base>.<blocks>.<i>
    setattr(trunk, kind.blocks_name, torch.nn.ModuleDict({str(i): all_blocks[i] for c in chunks for i in c}))
    if stage != 0:
        for name in kind.embeddings:
            setattr(trunk, name, None)
    if stage != stages - 1:
        for name in kind.final:
            setattr(trunk, name, None)
        model.lm_head = None
    model._hpc_sequence_factor = 1
    model._hpc_family = kind
    model._hpc_chunks = [[str(i) for i in c] for c in chunks]
    model.forward = types.MethodType(decoder_families.stage_forward, model)
    return model


class _Chunk(torch.nn.Module):
    """One virtual stage of a rank's model for torch's multi-stage schedules: its forward is the model's own on
    this chunk's blocks, so the model's hooks (FSDP2's gathering of the embeddings and the head) run as on a single
    stage. It registers no parameters: the schedule is told not to scale gradients, Pipeline does it once."""

    def __init__(self, model: torch.nn.Module, index: int):
        super().__init__()
        object.__setattr__(self, "model", model)  # not a submodule: its parameters stay the model's alone
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x, chunk=self.index)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' causal-LM loss: the next token's cross entropy, averaged over the tokens not -100."""
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), shifted.reshape(-1),
                                             ignore_index=-100)


class Pipeline:
    """One pipeline rank's stages of the model and the schedule that drives all stages' micro-batches: one stage
    per rank (1F1B, GPipe), or ``virtual`` stages per rank (interleaved 1F1B, looped BFS)."""

    def __init__(self, model: torch.nn.Module, pp_mesh, device: torch.device, micro_batches: int,
                 schedule: str = "1f1b", virtual: int = 1):
        from torch.distributed import pipelining

        name = schedule.lower()
        if name not in SCHEDULES:
            raise HpcError(f"pipeline schedule {schedule!r} is not one hpc runs", fix=f"use {', '.join(SCHEDULES)}")
        torch_class, multi = SCHEDULES[name]
        if multi != (virtual > 1):
            raise HpcError(f"pipeline schedule {name} runs {'several stages' if multi else 'one stage'} per rank; "
                           f"the model was split into {virtual}", fix="use interleaved_1f1b or looped_bfs with "
                           "num_layers_per_virtual_pipeline_stage, 1f1b or gpipe without")
        self.group, self.stages = pp_mesh.get_group(), pp_mesh.size()
        self.stage_index = pp_mesh.get_local_rank()
        self.first, self.last = self.stage_index == 0, self.stage_index == self.stages - 1
        self.micro_batches, self.model = micro_batches, model
        self.scale = multi  # the multi-stage schedules' stages hold no parameters of their own (_Chunk)
        if not multi:
            stage = pipelining.PipelineStage(model, self.stage_index, self.stages, device, group=self.group)
            self.schedule = getattr(pipelining, torch_class)(stage, n_microbatches=micro_batches,
                                                             loss_fn=causal_lm_loss)
            return
        total = self.stages * virtual
        stages = [pipelining.PipelineStage(_Chunk(model, i), s, total, device, group=self.group)
                  for i, s in enumerate(rank_stages(self.stage_index, self.stages, virtual))]
        self.schedule = getattr(pipelining, torch_class)(stages, n_microbatches=micro_batches,
                                                         loss_fn=causal_lm_loss, scale_grads=False)

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
            if self.scale:  # the mean over the micro-batches, as the single-stage schedules' scale_grads
                for param in self.model.parameters():
                    if param.grad is not None:
                        param.grad.div_(self.micro_batches)
        else:
            logits = self.schedule.eval(*args, target=target, losses=losses)
        loss = (torch.stack([x.detach().float() for x in losses]).mean() if self.last
                else torch.zeros((), device=input_ids.device))
        dist.broadcast(loss, group=self.group, group_src=self.stages - 1)
        return loss, (logits if self.last else None)
