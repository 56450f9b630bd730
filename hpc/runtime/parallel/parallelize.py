"""parallelize(): one model spread over the mesh, its parts applied in one fixed order, as torchtitan's
`parallelize` files apply theirs over ParallelDims.

The order, each step skipped where it has nothing to do:

1. precision: fp8's Float8Linear layers (torchao, fp8.py) and the forward run under autocast (precision.py).
   First, on the whole model, so that FSDP2 wraps the Float8Linear layers and gathers their shards in fp8.
2. place: the strategy's (the device; FSDP2's materialization of meta weights and their broadcast from rank 0).
   Then the pipeline split (pipeline.py): the model trimmed to this rank's stage, before anything cuts it.
3. context-parallel hooks (context_parallel/): the model's forward handed this rank's sequence positions.
4. tensor parallelism (tensor_parallel.py): the model's tp_plan on the mesh's "tp", unless transformers applied it
   already (from_pretrained(tp_plan=..., device_mesh=...)); then what the model needs once cut.
5. activation checkpointing: each block recomputed in backward; after tensor parallelism, so the wrappers hold
   the cut layers, and before sharding, so FSDP2 shards the wrapped blocks.
6. shard: the strategy's data-parallel wrap (FSDP2's fully_shard over the data-parallel mesh, DDP's wrapper, a
   DeepSpeed engine, or nothing).
7. compile (compile.py): in place, on the model inside the wrap, so its state_dict keys stay what they were.

This is the order hpc applied before parallelize() gathered it (precision in prepare(), then the strategy's steps,
then compile): no step moved. Placement (2) is the one step beyond torchtitan's list, where the weights first need
a device; under tensor parallelism alone (a mesh with no data-parallel dimension) FSDP2 has nothing to shard and
gives neither a shard (6) nor activation checkpointing (5), as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from hpc.runtime.parallel import tensor_parallel

Step = Callable[[torch.nn.Module], torch.nn.Module]


@dataclass(frozen=True)
class ModelSettings:
    """What parallelize() applies besides the mesh's own parts. ``precision`` changes the model in place
    (Precision.prepare_model); ``compile`` is called with (model, the module inside its wrap) and returns the
    model (compile.Compile). ``checkpoint_layers``: the classes whose modules are checkpointed; none named, the
    model's direct children's classes."""

    precision: Callable[[torch.nn.Module], None] | None = None
    context_parallel: object = None  # a context_parallel.ContextParallel, held by the strategy for the steps
    tp_plan: dict | None = None  # None: the model's own plan
    # what the model needs once cut, before anything wraps it (GPT-2's attention split, a tied head tied again)
    after_tensor_parallel: Callable[[torch.nn.Module], None] | None = None
    activation_checkpointing: bool = False
    checkpoint_layers: frozenset[str] = field(default_factory=frozenset)
    compile: Callable | None = None
    split: Callable[[torch.nn.Module], torch.nn.Module] | None = None  # the pipeline stage's trim (pipeline.trim)


def parallelize(model: torch.nn.Module, mesh, settings: ModelSettings, *, place: Step | None = None,
                shard: Step | None = None, unwrap: Step | None = None) -> torch.nn.Module:
    """``model`` spread over ``mesh`` (a ParallelismConfig whose DeviceMesh is built; None: no mesh), in the order
    of this module's docstring. ``place`` and ``shard``: the strategy's steps 2 and 6; ``unwrap``: the module
    inside what ``shard`` returned (compile compiles that one)."""
    if settings.precision is not None:
        settings.precision(model)
    if place is not None:
        model = place(model)
    if settings.split is not None:
        model = settings.split(model)
    if settings.context_parallel is not None:
        settings.context_parallel.prepare_model(model)
    if mesh is not None and mesh.device_mesh is not None and mesh.tp_enabled and not tensor_parallel.applied(model):
        model = tensor_parallel.apply(model, mesh.submesh("tp"), settings.tp_plan)
        if settings.after_tensor_parallel is not None:
            settings.after_tensor_parallel(model)
    if settings.activation_checkpointing:
        _checkpoint(model, settings.checkpoint_layers)
    if shard is not None:
        model = shard(model)
    if settings.compile is not None:
        model = settings.compile(model, unwrap(model) if unwrap is not None else model)
    return model


def _checkpoint(model: torch.nn.Module, layers: frozenset[str]) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    wanted = layers or {type(m).__name__ for m in model.children()}
    apply_activation_checkpointing(model, check_fn=lambda m: type(m).__name__ in wanted)
