"""hpc's job settings as the variables `accelerate launch` exports for them (the reverse of
accelerate_settings.from_environ), so code reading those (transformers' FSDP loading on rank 0 only,
Accelerate-aware libraries) sees the same job. Its own module: every render needs it, the translation of
Accelerate's settings only a job that brings them. Torch-free.
"""

from __future__ import annotations

from typing import Any, Callable


def _flag(v: Any) -> str:
    return "true" if v else "false"


# hpc key -> (variable, how its value is spelled there)
_EXPORTS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "mixed_precision": ("ACCELERATE_MIXED_PRECISION", str),
    "gradient_accumulation_steps": ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", str),
    "gradient_clipping": ("ACCELERATE_GRADIENT_CLIPPING", str),
    "use_cpu": ("ACCELERATE_USE_CPU", _flag),
    "debug": ("ACCELERATE_DEBUG_MODE", _flag),
    "dynamo_backend": ("ACCELERATE_DYNAMO_BACKEND", lambda v: str(v).upper()),
    "dynamo_mode": ("ACCELERATE_DYNAMO_MODE", str),
    "dynamo_use_fullgraph": ("ACCELERATE_DYNAMO_USE_FULLGRAPH", _flag),
    "dynamo_use_dynamic": ("ACCELERATE_DYNAMO_USE_DYNAMIC", _flag),
    "dynamo_use_regional_compilation": ("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", _flag),
    "fsdp_sharding_strategy": ("FSDP_SHARDING_STRATEGY", str),
    "fsdp_auto_wrap_policy": ("FSDP_AUTO_WRAP_POLICY",
                              lambda v: "TRANSFORMER_BASED_WRAP" if v == "TRANSFORMER_AUTO_WRAP" else str(v)),
    "fsdp_transformer_layer_cls_to_wrap": ("FSDP_TRANSFORMER_CLS_TO_WRAP", lambda v: ",".join(v)),
    "fsdp_min_num_params": ("FSDP_MIN_NUM_PARAMS", str),
    "fsdp_cpu_offload": ("FSDP_OFFLOAD_PARAMS", _flag),
    "fsdp_state_dict_type": ("FSDP_STATE_DICT_TYPE", str),
    "fsdp_activation_checkpointing": ("FSDP_ACTIVATION_CHECKPOINTING", _flag),
    "fsdp_reshard_after_forward": ("FSDP_RESHARD_AFTER_FORWARD", _flag),
    "fsdp_cpu_ram_efficient_loading": ("FSDP_CPU_RAM_EFFICIENT_LOADING", _flag),
    "fsdp_sync_module_states": ("FSDP_SYNC_MODULE_STATES", _flag),
    "zero_stage": ("ACCELERATE_DEEPSPEED_ZERO_STAGE", str),
    "deepspeed_config": ("ACCELERATE_DEEPSPEED_CONFIG_FILE", str),
    "offload_optimizer": ("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", lambda v: "cpu" if v else "none"),
    "offload_param": ("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", lambda v: "cpu" if v else "none"),
}
_STRATEGY_EXPORTS = {"fsdp": {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"},
                     "deepspeed": {"ACCELERATE_USE_DEEPSPEED": "true"}}


def to_environ(values: dict) -> dict[str, str]:
    """hpc job keys -> the variables `accelerate launch` exports for them, so that code reading those
    (transformers' FSDP loading on rank 0 only, Accelerate-aware libraries) sees the same job. The strategy's
    own settings go only with that strategy, as Accelerate exports them."""
    strategy = values.get("strategy")
    env = dict(_STRATEGY_EXPORTS.get(strategy, {}))
    for key, value in values.items():
        if value is None or key not in _EXPORTS:
            continue
        if (key.startswith("fsdp_") and strategy != "fsdp") or (
                key in ("zero_stage", "deepspeed_config", "offload_optimizer", "offload_param")
                and strategy != "deepspeed"):
            continue
        name, spell = _EXPORTS[key]
        env[name] = spell(value)
    return env
