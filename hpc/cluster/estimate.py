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

Per-dtype sizes (`--dtypes`) follow `accelerate estimate-memory` instead, so that its numbers can be compared
one to one: see dtype_sizes.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field

from hpc.errors import HpcError

# cheapest first: less communication and no host round trips before more sharding
STRATEGIES = ("ddp", "zero1", "zero2", "fsdp_grad_op", "fsdp", "zero3", "zero2_offload", "fsdp_offload",
              "zero3_offload")
PRECISIONS = {"no": 4, "fp32": 4, "bf16": 2, "fp16": 2}
_SUFFIX = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
# Accelerate's dtypes: the fp32 size is divided by these (int4 packs two weights a byte)
DTYPES = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}
_COUNT = re.compile(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([KMBGT]?)\s*", re.IGNORECASE)
_MODEL_FORMS = "a count such as 7B, a model folder with config.json, or module:callable"


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

    def activation_bytes(self, precision_bytes: int) -> int:
        s, b, h, L = self.seq_len, self.batch_size, self.hidden_size, self.layers
        if self.checkpointing:  # only each layer's input is kept; one layer is recomputed at a time
            per_layer_16bit = 2 * s * b * h
            recompute = s * b * h * (34 + (5 * self.heads * s / h if self.heads else 0))
            return int((per_layer_16bit * L + recompute) * precision_bytes / 2)
        per_layer_16bit = s * b * h * (34 + (5 * self.heads * s / h if self.heads else 0))
        return int(per_layer_16bit * L * precision_bytes / 2)


def parse_count(text: str | int | float) -> int:
    """'7B', '125M', '1.3e9', 70000000 -> a parameter count."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        count = text
    else:
        m = _COUNT.fullmatch(str(text))
        if not m:
            raise HpcError(f"{text!r} is not a parameter count", fix=f"give {_MODEL_FORMS}")
        count = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if count < 1:
        raise HpcError(f"{text!r} is not a parameter count", fix="give at least one parameter")
    return int(count)


def estimate(num_params: int, strategy: str, *, precision: str = "no", world_size: int = 1,
             shape: Shape | None = None) -> Estimate:
    if strategy not in STRATEGIES:
        raise HpcError(f"strategy {strategy!r} is not known", fix=f"use one of {', '.join(STRATEGIES)}")
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
    else:  # fsdp, fsdp_grad_op: fp32 shards of everything
        params, grads, opt = 4 * P / N, 4 * P / N, adam / N
    host = 0
    if offload:
        host, opt = opt, 0
        if base in ("zero3", "fsdp"):  # weights and gradients live on the host too; the GPU sees a layer at a time
            host, params, grads = host + params + grads, 0, 0
    activations = shape.activation_bytes(b) if shape else 0
    return Estimate(strategy, int(params), int(grads), int(opt), activations, int(host))


def cheapest_fit(estimates: list[Estimate], capacity: int) -> Estimate | None:
    """The first strategy (in STRATEGIES' order: least communication first) whose total fits."""
    order = {name: i for i, name in enumerate(STRATEGIES)}
    for e in sorted(estimates, key=lambda e: order[e.strategy]):
        if e.total <= capacity:
            return e
    return None


@dataclass
class ModelSize:
    """What the per-dtype table needs. Bytes are at fp32, as Accelerate builds the model, buffers included."""

    parameters: int
    total_bytes: int
    largest_layer_bytes: int | None = None  # None for a bare count: there are no layers to look at
    largest_layers: list[str] = field(default_factory=list)


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


def measure(target: str) -> ModelSize:
    """MODEL as the command takes it -> its size. Only a folder or module:callable imports torch."""
    has_config = os.path.isfile(os.path.join(target, "config.json"))
    if os.path.isdir(target) and (has_config or not _COUNT.fullmatch(target)):  # a stray folder named 7B is a count
        return model_size(build_from_folder(target))
    if ":" in target:
        return model_size(build_from_callable(target))
    if os.sep in target or "/" in target:  # a path that is not there, or a Hub name: hpc reads no Hub
        raise HpcError(f"{target!r} is not a local folder", fix=f"give {_MODEL_FORMS} (for a Hub model, "
                       f"download its config first: huggingface-cli download NAME config.json --local-dir DIR)")
    count = parse_count(target)
    return ModelSize(count, 4 * count)


def build_from_callable(target: str):
    """'package.module:callable' -> the model it builds, on the meta device."""
    import importlib

    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise HpcError(f"cannot load {target!r}: {e}", fix="give module:callable importable from here") from None
    import torch

    with torch.device("meta"):  # no memory is allocated, however large the model
        return factory()


def build_from_folder(folder: str):
    """A HuggingFace model folder -> its AutoModel built from config.json on the meta device. Reads no weights
    and never asks the Hub."""
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        raise HpcError(f"{folder} has no config.json", fix="give the folder that holds the model's config.json")
    try:
        import transformers
    except ImportError as e:
        if e.name != "transformers":  # installed but broken: its own message says what is wrong
            raise
        raise HpcError(f"reading the model folder {folder} needs transformers, which is not installed",
                       fix="pip install transformers") from None
    import torch

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # config sanity warnings would bury the table
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        with torch.device("meta"):  # what accelerate's init_empty_weights does for parameters, without accelerate
            return transformers.AutoModel.from_config(config)
    except (ValueError, KeyError, OSError) as e:  # unknown model_type, bad JSON, custom code: the user's config
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HpcError(f"transformers cannot build a model from {config_path}: {first}",
                       fix="check config.json (model_type and its fields) against the model's own") from None
    finally:
        transformers.logging.set_verbosity(verbosity)


def model_size(model) -> ModelSize:
    """Parameters (shared ones once) and Accelerate's sizes: every parameter and buffer, floating ones at fp32
    whatever dtype config.json asks for (Accelerate builds in fp32; others keep their own size); a layer is
    a module without children or one transformers keeps whole (`_no_split_modules`)."""
    sizes: dict[str, int] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        nbytes = t.numel() * (4 if t.is_floating_point() else t.element_size())
        parts = name.split(".")
        for i in range(len(parts) + 1):
            key = ".".join(parts[:i])
            sizes[key] = sizes.get(key, 0) + nbytes
    keep_whole = set(getattr(model, "_no_split_modules", None) or ())
    best, names = 0, []
    todo = [*model.named_parameters(recurse=False), *model.named_children(), *model.named_buffers(recurse=False)]
    while todo:
        name, item = todo.pop(0)
        children = list(item.named_children()) if hasattr(item, "named_children") else []
        if children and type(item).__name__ not in keep_whole:
            todo = [(f"{name}.{n}", c) for n, c in children] + todo
            continue
        size = sizes.get(name, 0)
        if size > best:
            best, names = size, [name]
        elif size == best:
            names.append(name)
    count = sum(p.numel() for p in model.parameters())
    return ModelSize(count, sizes.get("", 0), best, names)


def count_parameters(target: str) -> int:
    """'package.module:callable' -> the number of parameters of the model it builds, on the meta device."""
    return sum(p.numel() for p in build_from_callable(target).parameters())
