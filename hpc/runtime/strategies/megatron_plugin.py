"""Accelerate's Megatron-LM names, on torch's own parallelism (strategies/megatron.py runs them).

MegatronLMPlugin takes every field of Accelerate's (1.15) with its defaults and reads the MEGATRON_LM_* variables
`accelerate launch --use_megatron_lm` (and `hpc launch`) set. hpc uses: tp_degree, pp_degree, num_micro_batches,
sequence_parallelism, use_distributed_optimizer, recompute_activations, gradient_clipping, return_logits,
num_layers_per_virtual_pipeline_stage (interleaved virtual stages), and its own ``pipeline_schedule``. The fields
that configure Megatron-LM's own model classes, datasets and loop (custom_*, megatron_dataset_flag,
other_megatron_args) have nothing to act on here: set, they are refused in one line when the model is prepared.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

import torch

from hpc.contract.accelerate_settings import PIPELINE_SCHEDULES
from hpc.errors import HpcError

_TRUE = ("1", "true", "yes", "on")


def _env_bool(name: str, default: str = "false") -> bool:
    return os.environ.get("MEGATRON_LM_" + name, default).strip().lower() in _TRUE


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get("MEGATRON_LM_" + name)
    try:
        return int(raw) if raw not in (None, "", "None") else default
    except ValueError:
        raise HpcError(f"MEGATRON_LM_{name}={raw!r} is not a whole number", fix="set it to e.g. 2") from None


# what has no counterpart: Megatron-LM's own model classes, data sets and training steps
MEGATRON_ONLY = ("custom_train_step_class", "custom_model_provider_function", "custom_prepare_model_function",
                 "custom_megatron_datasets_provider_function", "custom_get_batch_function", "custom_loss_function",
                 "other_megatron_args")


@dataclass
class MegatronLMPlugin:
    tp_degree: int = None
    pp_degree: int = None
    use_custom_fsdp: bool = None
    overlap_cpu_optimizer_d2h_h2d: bool = None
    no_load_optim: bool = None
    eod_mask_loss: bool = None
    no_save_optim: bool = None
    optimizer_cpu_offload: bool = None
    use_precision_aware_optimizer: bool = None
    decoder_last_pipeline_num_layers: int = None
    recompute_granularity: str = None
    recompute_method: str = None
    recompute_num_layers: int = None
    attention_backend: bool = None
    expert_model_parallel_size: int = None
    context_parallel_size: int = None
    attention_dropout: float = None
    hidden_dropout: float = None
    attention_softmax_in_fp32: bool = None
    expert_tensor_parallel_size: int = None
    calculate_per_token_loss: bool = None
    use_rotary_position_embeddings: bool = None
    num_micro_batches: int = None
    gradient_clipping: float = None
    sequence_parallelism: bool = None
    recompute_activations: bool = None
    use_distributed_optimizer: bool = None
    pipeline_model_parallel_split_rank: int = None
    num_layers_per_virtual_pipeline_stage: int = None
    is_train_batch_min: str = True
    train_iters: int = None
    train_samples: int = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float = None
    end_weight_decay: float = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int = None
    lr_decay_samples: int = None
    lr_warmup_iters: int = None
    lr_warmup_samples: int = None
    lr_warmup_fraction: float = None
    min_lr: float = 0
    consumed_samples: list = None
    no_wd_decay_cond: Optional[Callable] = None
    scale_lr_cond: Optional[Callable] = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int = None
    encoder_seq_length: int = None
    decoder_seq_length: int = None
    tensorboard_dir: str = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Optional[Any] = None
    custom_train_step_kwargs: Optional[dict] = None
    custom_model_provider_function: Optional[Callable] = None
    custom_prepare_model_function: Optional[Callable] = None
    custom_megatron_datasets_provider_function: Optional[Callable] = None
    custom_get_batch_function: Optional[Callable] = None
    custom_loss_function: Optional[Callable] = None
    other_megatron_args: Optional[dict] = None
    # hpc's: the torch.distributed.pipelining schedule (PIPELINE_SCHEDULES); MEGATRON_LM_PIPELINE_SCHEDULE
    pipeline_schedule: str = None

    def __post_init__(self):
        if self.tp_degree is None:
            self.tp_degree = _env_int("TP_DEGREE", 1)
        if self.pp_degree is None:
            self.pp_degree = _env_int("PP_DEGREE", 1)
        if self.num_micro_batches is None:
            self.num_micro_batches = _env_int("NUM_MICRO_BATCHES", 1)
        if self.gradient_clipping is None:
            self.gradient_clipping = float(os.environ.get("MEGATRON_LM_GRADIENT_CLIPPING", 1.0))
        for name in ("sequence_parallelism", "recompute_activations", "use_distributed_optimizer"):
            if getattr(self, name) is None:
                setattr(self, name, _env_bool(name.upper()))
        if self.pipeline_schedule is None:
            self.pipeline_schedule = os.environ.get("MEGATRON_LM_PIPELINE_SCHEDULE", "1f1b")
        for name in ("tp_degree", "pp_degree", "num_micro_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HpcError(f"MegatronLMPlugin({name}={value!r}) must be a whole number >= 1", fix="use 1 or more")
        if self.num_layers_per_virtual_pipeline_stage is None:
            self.num_layers_per_virtual_pipeline_stage = _env_int("NUM_LAYERS_PER_VIRTUAL_PIPELINE_STAGE", 0) or None
        per = self.num_layers_per_virtual_pipeline_stage
        if per is not None and (isinstance(per, bool) or not isinstance(per, int) or per < 1):
            raise HpcError(f"MegatronLMPlugin(num_layers_per_virtual_pipeline_stage={per!r}) must be a whole number "
                           ">= 1", fix="use e.g. 1, or leave it unset for one stage per rank")
        if self.pipeline_schedule.lower() not in PIPELINE_SCHEDULES:
            raise HpcError(f"MegatronLMPlugin(pipeline_schedule={self.pipeline_schedule!r}) is not a pipeline "
                           "schedule hpc runs", fix=f"use {', '.join(PIPELINE_SCHEDULES)}")
        if self.pp_degree == 1 and self.num_micro_batches > 1:
            self.num_micro_batches = 1  # as Megatron-LM: micro-batches are the pipeline's
        self.global_batch_size = None  # the loader's batch x the data-parallel ranks, once a loader is prepared
        self.micro_batch_size = None

    def check_supported(self) -> None:
        """Megatron-LM's own model classes, data sets and steps: refused by name."""
        given = [name for name in MEGATRON_ONLY if getattr(self, name) is not None]
        if self.megatron_dataset_flag:
            given.append("megatron_dataset_flag")
        if given:
            raise HpcError(f"MegatronLMPlugin({given[0]}=...) configures Megatron-LM's own model classes, data sets or "
                           "train step, which hpc does not run (it trains the transformers model itself on torch's "
                           "tensor and pipeline parallelism)",
                           fix="leave it unset; compute a custom loss from the model's outputs in the script")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class MegatronLMDummyScheduler(torch.optim.lr_scheduler.LambdaLR):
    """Accelerate's stand-in for Megatron-LM's scheduler: here a real one, linear warm-up then linear decay to 0
    over ``total_num_steps`` optimizer steps, the learning rate transformers' get_scheduler("linear") gives the
    script's non-Megatron branch at the same step. prepare() steps it once per optimizer step (not once per
    process, as the non-Megatron branch's, whose step counts are multiplied by num_processes)."""

    steps_once_per_update = True

    def __init__(self, optimizer, total_num_steps: int | None = None, warmup_num_steps: int = 0, **kwargs):
        self.total_num_steps, self.warmup_num_steps, self.kwargs = total_num_steps, int(warmup_num_steps or 0), kwargs
        total = int(total_num_steps) if total_num_steps else None
        warmup = self.warmup_num_steps

        def factor(step: int) -> float:
            if step < warmup:
                return step / max(1, warmup)
            if total is None:
                return 1.0
            return max(0.0, (total - step) / max(1, total - warmup))

        super().__init__(optimizer, factor)


@dataclass
class MegatronLMDummyDataLoader:
    """Accelerate's stand-in for Megatron-LM's own indexed data sets: they are read by Megatron-LM's code, which
    hpc does not run. Built, it says so; a torch DataLoader of the data set is what hpc prepares."""

    dataset_args: dict = field(default_factory=dict)

    def __init__(self, **dataset_kwargs):
        raise HpcError("MegatronLMDummyDataLoader stands for Megatron-LM's indexed data sets, read by Megatron-LM's "
                       "own code, which hpc does not run", fix="give prepare() a torch DataLoader of the data set")


def add_model_config_to_megatron_parser(model_type: str):
    """Accelerate's decorator that registers how Megatron-LM's argument parser reads a model config; hpc builds no
    Megatron arguments (the model is the script's own), so registering one is refused rather than kept unread."""
    def register(parser_function):
        raise HpcError(f"add_model_config_to_megatron_parser({model_type!r}) feeds Megatron-LM's own argument "
                       "parser, which hpc does not run (the model is the one the script builds)",
                       fix="drop the registration; hpc splits the script's transformers model itself")
    return register


class AbstractTrainStep:
    """Accelerate's base for Megatron-LM's train steps (its loss and batch functions inside Megatron-LM's loop)."""

    def __init__(self, name: str = "", *args, **kwargs):
        raise HpcError(f"{type(self).__name__} is a train step of Megatron-LM's own loop, which hpc does not run",
                       fix="compute the loss from the model's outputs in the script (model(**batch).loss)")


class BertTrainStep(AbstractTrainStep):
    pass


class GPTTrainStep(AbstractTrainStep):
    pass


class T5TrainStep(AbstractTrainStep):
    pass


def _megatron_strategy():
    from hpc.runtime.process.state import AcceleratorState

    strategy = getattr(AcceleratorState(), "strategy", None)
    if strategy is None or getattr(strategy, "name", None) != "megatron":
        raise HpcError("this needs an Accelerator running the Megatron-LM layout",
                       fix="Accelerator(megatron_lm_plugin=MegatronLMPlugin(...)) or distributed_type MEGATRON_LM")
    return strategy


def avg_losses_across_data_parallel_group(losses: list) -> torch.Tensor:
    """The losses averaged over the data-parallel ranks (Accelerate's, for Megatron-LM's data-parallel group)."""
    import torch.distributed as dist

    averaged = torch.cat([torch.as_tensor(x).detach().clone().float().reshape(1) for x in losses])
    group = _megatron_strategy().data_parallel_group()
    if group is not None:
        dist.all_reduce(averaged, group=group)
        averaged /= dist.get_world_size(group)
    return averaged


def gather_across_data_parallel_groups(tensor):
    """Every data-parallel rank's tensors, concatenated along dim 0 (nested lists, tuples and dicts kept)."""
    import torch.distributed as dist

    group = _megatron_strategy().data_parallel_group()

    def gather(t):
        if isinstance(t, (list, tuple)):
            return type(t)(gather(x) for x in t)
        if isinstance(t, dict):
            return {k: gather(v) for k, v in t.items()}
        if group is None:
            return t
        t = t.contiguous() if t.dim() else t.reshape(1)
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, t, group=group)
        return torch.cat(parts, dim=0)

    return gather(tensor)


def _megatron_only(name: str, use: str) -> Callable:
    def refuse(*args, **kwargs):
        raise HpcError(f"{name} belongs to Accelerate's Megatron-LM engine (Megatron-LM's own initialization, model "
                       "classes and loop), which hpc does not run", fix=use)

    refuse.__name__ = name
    return refuse


_PREPARE = "accelerator.prepare(model, optimizer, dataloaders, scheduler) lays them out"
megatron_lm_initialize = _megatron_only("megatron_lm_initialize", "Accelerator(megatron_lm_plugin=...) sets it up")
megatron_lm_prepare_data_loader = _megatron_only("megatron_lm_prepare_data_loader", _PREPARE)
megatron_lm_prepare_model_optimizer_scheduler = _megatron_only("megatron_lm_prepare_model_optimizer_scheduler",
                                                               _PREPARE)
megatron_lm_prepare_optimizer = _megatron_only("megatron_lm_prepare_optimizer", _PREPARE)
megatron_lm_prepare_scheduler = _megatron_only("megatron_lm_prepare_scheduler", _PREPARE)


class _MegatronOnlyClass:
    def __init__(self, *args, **kwargs):
        raise HpcError(f"{type(self).__name__} wraps Megatron-LM's own engine, which hpc does not run",
                       fix=f"{_PREPARE}; prepare() returns hpc's own wrappers")


class MegatronEngine(_MegatronOnlyClass):
    pass


class MegatronLMOptimizerWrapper(_MegatronOnlyClass):
    pass


class MegatronLMSchedulerWrapper(_MegatronOnlyClass):
    pass
