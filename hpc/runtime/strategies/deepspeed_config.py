"""Build the DeepSpeed config: the user's JSON (if any) with its "auto" values filled from hpc's settings.

A value the user's JSON states explicitly is kept, unless it contradicts what the training loop really does
(accumulation steps, precision): then the error names both, instead of DeepSpeed silently doing something else.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hpc.errors import HpcError

AUTO = "auto"


def _load(source) -> dict:
    if source is None:
        return {}
    if isinstance(source, dict):
        return copy.deepcopy(source)
    path = Path(source)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise HpcError(f"DeepSpeed config {str(path)!r} does not exist", fix="check deepspeed_config") from None
    except json.JSONDecodeError as e:
        raise HpcError(f"DeepSpeed config {str(path)!r} is not valid JSON: {e.msg} at line {e.lineno}",
                       fix="fix the JSON") from None


def _fill(cfg: dict, key: str, value, *, must_match: bool = False, what: str = "") -> None:
    current = cfg.get(key, AUTO)
    if current == AUTO:
        cfg[key] = value
    elif must_match and current != value:
        raise HpcError(f"the DeepSpeed config says {key}={current!r} but {what} is {value!r}",
                       fix=f'set "{key}": "auto" in the JSON, or make them agree')


def _bucket(num_params: int) -> int:
    # DeepSpeed's fixed defaults (5e8 elements) allocate gigabytes even for a small model; scale with it
    return int(min(5e8, max(4096, num_params // 16)))


def build(plugin, *, micro_batch_size: int, gradient_accumulation_steps: int, world_size: int,
          mixed_precision: str, num_params: int) -> dict:
    cfg = _load(plugin.hf_ds_config)
    _fill(cfg, "gradient_accumulation_steps", gradient_accumulation_steps, must_match=True,
          what="the Accelerator's gradient_accumulation_steps")
    _fill(cfg, "train_micro_batch_size_per_gpu", micro_batch_size)
    _fill(cfg, "train_batch_size", cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]
          * world_size, must_match=True, what="micro batch x accumulation x world size")
    _fill(cfg, "gradient_clipping", plugin.gradient_clipping or 0.0)

    zero = cfg.setdefault("zero_optimization", {})
    _fill(zero, "stage", plugin.zero_stage)
    _fill(zero, "reduce_bucket_size", _bucket(num_params))
    _fill(zero, "allgather_bucket_size", _bucket(num_params))
    if zero["stage"] == 3:
        _fill(zero, "stage3_prefetch_bucket_size", _bucket(num_params))
        # parameters below this many elements stay whole on every rank (DeepSpeed's default: 1e5)
        _fill(zero, "stage3_param_persistence_threshold", int(min(1e5, num_params // 100)))
    if plugin.offload_optimizer:
        zero.setdefault("offload_optimizer", {"device": "cpu", "pin_memory": False})
    if plugin.offload_param:
        if zero["stage"] != 3:
            raise HpcError("offload_param needs ZeRO stage 3", fix="set zero_stage 3")
        zero.setdefault("offload_param", {"device": "cpu", "pin_memory": False})

    for mode in ("bf16", "fp16"):
        section = cfg.setdefault(mode, {})
        wanted = mixed_precision == mode
        if section.get("enabled", AUTO) == AUTO:
            section["enabled"] = wanted
        elif section["enabled"] != wanted:
            raise HpcError(f"the DeepSpeed config has {mode}.enabled={section['enabled']} but mixed_precision is "
                           f"{mixed_precision!r}", fix=f'set "{mode}": {{"enabled": "auto"}}, or make them agree')
    if cfg["fp16"]["enabled"]:
        cfg["fp16"].setdefault("loss_scale", 0)  # dynamic
        cfg["fp16"].setdefault("initial_scale_power", 16)
    # a torch optimizer handed to ZeRO is fine (DeepSpeed only tests its own); printing every step is not
    cfg.setdefault("zero_allow_untested_optimizer", True)
    cfg.setdefault("steps_per_print", 2**31 - 1)
    cfg.update(plugin.extra)
    return cfg


def fill_optimizer(cfg: dict, dummy, *, cpu: bool) -> None:
    """DummyOptim: the config must define the optimizer; its "auto" lr and weight decay come from the dummy."""
    if "optimizer" not in cfg:
        raise HpcError("DummyOptim needs an \"optimizer\" section in the DeepSpeed config",
                       fix="add one, or pass a torch optimizer to prepare()")
    params = cfg["optimizer"].setdefault("params", {})
    _fill(params, "lr", dummy.lr)
    _fill(params, "weight_decay", dummy.weight_decay)
    if cpu and str(cfg["optimizer"].get("type", "")).lower() in ("adam", "adamw"):
        params.setdefault("torch_adam", True)  # DeepSpeed's fused Adam is a CUDA kernel


def fill_scheduler(cfg: dict, dummy) -> None:
    """DummyScheduler: the "auto" values of the config's scheduler come from the dummy (step counts) and the
    optimizer (the peak rate). Only keys the scheduler type takes are touched; the decaying types need their
    total_num_steps."""
    if "scheduler" not in cfg:
        return
    params = cfg["scheduler"].setdefault("params", {})
    lr = cfg.get("optimizer", {}).get("params", {}).get("lr", getattr(dummy.optimizer, "lr", None))
    values = {"total_num_steps": dummy.total_num_steps, "warmup_num_steps": dummy.warmup_num_steps,
              "warmup_max_lr": lr, "warmup_min_lr": 0.0}
    if cfg["scheduler"].get("type") in ("WarmupDecayLR", "WarmupCosineLR"):
        params.setdefault("total_num_steps", AUTO)
    for key, value in values.items():
        if params.get(key) == AUTO:
            if value is None:
                raise HpcError(f"the DeepSpeed scheduler's {key} is \"auto\" and DummyScheduler gave none",
                               fix=f"pass DummyScheduler({key}=...)")
            params[key] = value
