"""Bytes per GPU for training a model of P parameters with AdamW, per strategy. Torch-free
(until a model is built from a folder or module:callable).

The accounting (checked against measured runs in tests/test_strategies.py):
- DDP keeps fp32 weights, fp32 gradients and Adam's two fp32 moments: 16 bytes a parameter, on every rank.
  Mixed precision (autocast) casts on the fly and changes none of that.
- ZeRO-1 shards Adam's moments, ZeRO-2 also the gradients, ZeRO-3 also the weights (DeepSpeed's ZeRO-1 ends
  up holding only its gradient partition too: measured equal to ZeRO-2). Weights and gradients
  are in the compute precision; DeepSpeed adds an fp32 master copy of each rank's partition.
- FSDP2 shards fp32 weights, gradients and moments (8 + 4 + 4 bytes / N); mixed precision only adds
  transient low-precision copies of the layer being computed.
- Offload moves the sharded optimizer state (and with ZeRO-3 / FSDP weights and gradients) to host memory;
  the layer being computed still passes through the GPU (not counted: it depends on the layer's size).
Activations: the per-layer transformer estimate of Korthikanti et al. (2022) when the shape is given.
- A mesh (ParallelismConfig, FSDP2 strategies only): tensor parallelism over `tp` ranks cuts every weight, its
  gradient and moments by tp before FSDP shards them over dp_shard = world / (tp x dp_replicate); HSDP's
  dp_replicate ranks hold the same shards. Activations under tp follow the same paper without sequence
  parallelism: s b h (10 + 24 / tp + 5 a s / (h tp)) a layer, the layer norms' and dropouts' part left whole.
  Context parallelism over `cp` ranks cuts each sequence in cp parts: a rank keeps s / cp tokens' activations
  (its queries attend to all s keys, so the attention term divides by cp too), every term divided by cp. Its
  ranks are part of FSDP's shard group (dp_shard x cp = world / (tp x dp_replicate)), so the state per rank is
  what FSDP over the same ranks holds.

- Pipeline parallelism over `pp` stages (Megatron-LM's layout, MegatronLMPlugin pp_degree): each stage holds
  1/pp of the layers, so weights, gradients and moments divide by pp before FSDP shards them over the data ranks
  (world / (tp x pp x dp_replicate)). Activations: under 1F1B the first stage keeps pp micro-batches in flight, each
  through its L/pp layers, so a rank holds L layers' activations of one micro-batch (--batch-size), as unsplit.

Per-dtype sizes (`--dtypes`) follow `accelerate estimate-memory` instead, so that its numbers can be compared
one to one: see dtype_sizes.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from hpc.contract.model_size import ModelSize
from hpc.errors import HpcError

# cheapest first: less communication and no host round trips before more sharding
STRATEGIES = ("ddp", "zero1", "zero2", "fsdp_grad_op", "fsdp", "zero3", "zero2_offload", "fsdp_offload",
              "zero3_offload")
PRECISIONS = {"no": 4, "fp32": 4, "bf16": 2, "fp16": 2}
_SUFFIX = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
# Accelerate's dtypes: the fp32 size is divided by these (int4 packs two weights a byte)
DTYPES = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}
PARAMETER_COUNT = re.compile(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([KMBGT]?)\s*", re.IGNORECASE)
MODEL_FORMS = "a count such as 7B, a model folder with config.json, or module:callable"


@dataclass
class Estimate:
    strategy: str
    params: int
    grads: int
    optimizer: int  # moments and master copies
    activations: int
    host: int  # offloaded to CPU memory

    @property
    def state_bytes(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.state_bytes + self.activations

    def as_dict(self) -> dict:
        return {**asdict(self), "state_bytes": self.state_bytes, "total": self.total}


@dataclass
class Shape:
    """A transformer's shape, for the activation estimate."""

    batch_size: int
    seq_len: int
    hidden_size: int
    layers: int
    heads: int = 0
    checkpointing: bool = False

    def activation_bytes(self, precision_bytes: int, tp: int = 1, cp: int = 1) -> int:
        s, b, h, L = self.seq_len, self.batch_size, self.hidden_size, self.layers
        local = s / cp  # context parallelism: the rank's part of the sequence (its queries see all s keys)
        attention = 5 * self.heads * s / h if self.heads else 0
        layer = local * b * h * (10 + 24 / tp + attention / tp)  # tp 1, cp 1: the paper's 34 + 5 a s / h
        if self.checkpointing:  # only each layer's input is kept; one layer is recomputed at a time
            return int((2 * local * b * h * L + layer) * precision_bytes / 2)
        return int(layer * L * precision_bytes / 2)


def parse_count(text: str | int | float) -> int:
    """'7B', '125M', '1.3e9', 70000000 -> a parameter count."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        count = text
    else:
        m = PARAMETER_COUNT.fullmatch(str(text))
        if not m:
            raise HpcError(f"{text!r} is not a parameter count", fix=f"give {MODEL_FORMS}")
        count = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if count < 1:
        raise HpcError(f"{text!r} is not a parameter count", fix="give at least one parameter")
    return int(count)


MESH_STRATEGIES = ("fsdp_grad_op", "fsdp", "fsdp_offload")  # what a ParallelismConfig composes with


def mesh_label(strategy: str, tp: int, dp_replicate: int, cp: int = 1, pp: int = 1) -> str:
    parts = [f"pp {pp}"] if pp > 1 else []
    parts += [f"tp {tp}"] if tp > 1 else []
    parts += [f"cp {cp}"] if cp > 1 else []
    parts += [f"replicate {dp_replicate}"] if dp_replicate > 1 else []
    return f"{strategy} ({', '.join(parts)})" if parts else strategy


def estimate(num_params: int, strategy: str, *, precision: str = "no", world_size: int = 1,
             shape: Shape | None = None, tp: int = 1, dp_replicate: int = 1, cp: int = 1, pp: int = 1) -> Estimate:
    if strategy not in STRATEGIES:
        raise HpcError(f"strategy {strategy!r} is not known", fix=f"use one of {', '.join(STRATEGIES)}")
    mesh = f"tp {tp} x cp {cp} x replicate {dp_replicate}" if cp != 1 else f"tp {tp} x replicate {dp_replicate}"
    mesh = f"pp {pp} x {mesh}" if pp != 1 else mesh
    if (tp > 1 or cp > 1 or dp_replicate > 1 or pp > 1) and strategy not in MESH_STRATEGIES:
        raise HpcError(f"{strategy} with {mesh}: a mesh composes with FSDP2 only",
                       fix=f"use {', '.join(MESH_STRATEGIES)}")
    if tp < 1 or cp < 1 or dp_replicate < 1 or pp < 1 or world_size % (tp * cp * dp_replicate * pp):
        raise HpcError(f"{mesh} does not divide {world_size} GPU(s)",
                       fix="give sizes whose product divides the world size")
    if precision not in PRECISIONS:
        raise HpcError(f"precision {precision!r} is not known", fix="use no, bf16 or fp16")
    if world_size < 1:
        raise HpcError(f"world size {world_size} must be at least 1", fix="give 1 or more GPUs")
    P, N, b = num_params, world_size, PRECISIONS[precision]
    adam, master = 8 * P, 4 * P
    base = strategy.removesuffix("_offload")
    offload = strategy.endswith("_offload")
    if base == "ddp":
        params, grads, opt = 4 * P, 4 * P, adam
    elif base == "zero1":
        # measured: DeepSpeed's stage 1 reduces gradients bucket by bucket into the rank's partition during
        # backward, as stage 2 does, so it holds the same bytes; the stages differ in communication
        params, grads, opt = b * P, b * P / N, (adam + master) / N
    elif base == "zero2":
        params, grads, opt = b * P, b * P / N, (adam + master) / N
    elif base == "zero3":
        params, grads, opt = b * P / N, b * P / N, (adam + master) / N
    else:  # fsdp, fsdp_grad_op: fp32 shards of everything, over dp_shard x cp after tp cut it
        # pp x tp x (dp_shard x cp): cp's ranks are in FSDP's shard group; each stage holds 1/pp of the layers
        shards = pp * tp * (N // (pp * tp * dp_replicate))
        params, grads, opt = 4 * P / shards, 4 * P / shards, adam / shards
    host = 0
    if offload:
        host, opt = opt, 0
        if base in ("zero3", "fsdp"):  # weights and gradients live on the host too; the GPU sees a layer at a time
            host, params, grads = host + params + grads, 0, 0
    activations = shape.activation_bytes(b, tp, cp) if shape else 0
    return Estimate(mesh_label(strategy, tp, dp_replicate, cp, pp), int(params), int(grads), int(opt), activations,
                    int(host))


# fast-tier folders a rank's state is in at once: the KEEP kept (hpc.runtime.checkpoint.tiers.node_store) and the
# one being written, for its own state and for the copy it keeps of the previous node's (replicas 2)
FAST_TIER_FOLDERS = 3


# what a fast tier that does not fit the node memory is told to do (estimate-memory and submit say it)
FAST_TIER_FIX = "lower fast_tier.replicas, or turn fast_tier off"


def fast_tier_node_bytes(state_bytes: int, replicas: int) -> int:
    """Node memory the fast tier takes on each node, for ``state_bytes`` of replicated state (weights and optimizer
    state, what one DDP rank saves): the node's first rank writes it into node memory once for the node (the other
    ranks their random streams and readers, a few KiB), and the node keeps the previous node's copy besides."""
    return state_bytes * replicas * FAST_TIER_FOLDERS


def fast_tier_bytes(estimate: Estimate, replicas: int) -> int:
    """fast_tier_node_bytes for an estimate's state (DDP: weights and optimizer state)."""
    return fast_tier_node_bytes(estimate.params + estimate.optimizer, replicas)


def fast_tier_fit(need: int, node_memory: int | None, beside: int = 0) -> dict:
    """The fast tier's bytes per node (``need``) against the node memory the job has (None: not known), with
    ``beside`` bytes of the job's own in host memory: what `hpc estimate-memory --json` and `hpc submit --json`
    carry as ``fast_tier``."""
    return {"bytes_per_node": need, "node_memory_bytes": node_memory,
            "fits": None if node_memory is None else need + beside <= node_memory}


def cheapest_fit(estimates: list[Estimate], capacity: int) -> Estimate | None:
    """The first strategy (in STRATEGIES' order: least communication first) whose total fits."""
    order = {name: i for i, name in enumerate(STRATEGIES)}
    for e in sorted(estimates, key=lambda e: order[e.strategy.split(" (")[0]]):
        if e.total <= capacity:
            return e
    return None




def dtype_sizes(size: ModelSize, dtypes: list[str] | tuple[str, ...] = tuple(DTYPES)) -> list[dict]:
    """Accelerate's estimate-memory rows: the largest layer and the total in each dtype, and training with Adam.

    Training is Accelerate's peak: the largest of its stages (weights, gradients, Adam's moments, the step),
    not their sum, always counted from the fp32 size. float32: the step holds weights, gradients and both
    moments, 4x. float16 (mixed precision): the two fp32 moments are the largest stage, 2x. int8 and int4 are
    not trained, so None. The strategies table sums instead, and is the one to plan a job with.
    """
    rows = []
    for name in dtypes:
        if name not in DTYPES:
            raise HpcError(f"dtype {name!r} is not known", fix=f"use some of {', '.join(DTYPES)}")
        div = DTYPES[name]
        training = {"float32": 4 * size.total_bytes, "float16": 2 * size.total_bytes}.get(name)
        # rounded up: half a byte of int4 still takes a byte
        layer = None if size.largest_layer_bytes is None else -(-size.largest_layer_bytes // div)
        rows.append({"dtype": name, "largest_layer_bytes": layer, "total_bytes": -(-size.total_bytes // div),
                     "training_adam_peak_bytes": training})
    return rows










