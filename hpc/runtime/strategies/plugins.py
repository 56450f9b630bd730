"""`FullyShardedDataParallelPlugin` and `DeepSpeedPlugin`: the spellings Accelerate users write.

Each plugin can also be built from the job's runtime config (the flat keys of hpc.contract.training), so a
profile, job file or flag chooses the same thing code does. Arguments given in code win.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpc.errors import HpcError

SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
WRAPPING = ("TRANSFORMER_AUTO_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
STATE_DICTS = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")


_ALIASES = {"TRANSFORMER_BASED_WRAP": "TRANSFORMER_AUTO_WRAP"}  # Accelerate's spelling of the same policy


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    # torch's enums (ShardingStrategy.FULL_SHARD) and Accelerate's numbers ("1" = FULL_SHARD) are accepted too
    text = getattr(value, "name", value)
    if isinstance(text, int) or (isinstance(text, str) and text.isdigit()):
        index = int(text) - 1
        text = allowed[index] if 0 <= index < len(allowed) else str(text)
    text = _ALIASES.get(str(text).upper(), str(text).upper())
    if text not in allowed:
        raise HpcError(f"{name}={value!r} is not known", fix=f"use one of {', '.join(allowed)}")
    return text


@dataclass
class FullyShardedDataParallelPlugin:
    sharding_strategy: Any = "FULL_SHARD"
    auto_wrap_policy: Any = None  # None: wrap the layer classes if named, else only the whole model
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int = 0
    cpu_offload: bool = False
    activation_checkpointing: bool = False
    state_dict_type: Any = "FULL_STATE_DICT"
    sync_each_microstep: bool = False  # reduce-scatter every micro-step: less memory, more traffic
    reshard_after_forward: bool | None = None  # None: what the sharding strategy implies
    mixed_precision_policy: Any = None  # a torch MixedPrecisionPolicy; None: from mixed_precision
    sync_module_states: bool = False  # rank 0's weights are broadcast to the others before sharding
    # transformers loads pretrained weights on rank 0 only (the others on the meta device); implies the above
    cpu_ram_efficient_loading: bool = False
    # Accelerate 1.15's other keywords. FSDP1's, taken as FSDP2 has them: it always shards the original
    # parameters, limits its all-gathers and prefetches one module ahead in both passes, and hpc gathers
    # full state dicts onto rank 0's CPU (FullStateDictConfig(offload_to_cpu=True, rank0_only=True)).
    fsdp_version: int = 2  # 1 is run as FSDP2, as `accelerate launch --fsdp_version 1` is (a note at launch)
    backward_prefetch: Any = None
    forward_prefetch: bool = False
    limit_all_gathers: bool = True
    use_orig_params: bool = True
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    ignored_modules: Any = None  # modules left unsharded (fully_shard's ignored_params)
    param_init_fn: Any = None  # called on each module a rank built on the meta device, instead of to_empty
    activation_checkpointing_offload: bool = False

    def __post_init__(self):
        if str(self.fsdp_version) not in ("1", "2"):
            raise HpcError(f"fsdp_version={self.fsdp_version!r} is not known", fix="use 2 (or 1, run as FSDP2)")
        if self.activation_checkpointing_offload:
            raise HpcError("activation_checkpointing_offload=True is not supported by hpc (activations are "
                           "recomputed on the device)", fix="use activation_checkpointing=True alone")
        if self.param_init_fn is not None and not callable(self.param_init_fn):
            raise HpcError(f"param_init_fn={self.param_init_fn!r} is not callable",
                           fix="pass a function taking a module, or drop it")
        self.sharding_strategy = _choice("sharding_strategy", self.sharding_strategy, SHARDING)
        if isinstance(self.transformer_cls_names_to_wrap, str):
            self.transformer_cls_names_to_wrap = [n.strip() for n in self.transformer_cls_names_to_wrap.split(",")
                                                  if n.strip()]
        if self.auto_wrap_policy is None:
            self.auto_wrap_policy = ("TRANSFORMER_AUTO_WRAP" if self.transformer_cls_names_to_wrap else
                                     "SIZE_BASED_WRAP" if self.min_num_params else "NO_WRAP")
        self.auto_wrap_policy = _choice("auto_wrap_policy", self.auto_wrap_policy, WRAPPING)
        self.state_dict_type = _choice("state_dict_type", self.state_dict_type, STATE_DICTS)
        self.sync_module_states = bool(self.sync_module_states or self.cpu_ram_efficient_loading)
        if self.auto_wrap_policy == "SIZE_BASED_WRAP" and self.min_num_params <= 0:
            raise HpcError("auto_wrap_policy SIZE_BASED_WRAP needs min_num_params", fix="set min_num_params, e.g. 1e6")

    def set_state_dict_type(self, state_dict_type=None) -> None:
        """Accelerate's: switch how save_state and save_fsdp_model write the model (typically sharded while
        training, full for the final save)."""
        if state_dict_type is not None:
            self.state_dict_type = _choice("state_dict_type", state_dict_type, STATE_DICTS)

    def set_auto_wrap_policy(self, model) -> None:
        """Accelerate's: settle the wrap policy for ``model`` before prepare(). TRANSFORMER_AUTO_WRAP takes the
        model's `_no_split_modules` when no class was named, and every named class must be in the model;
        SIZE_BASED_WRAP without min_num_params wraps nothing but the whole model. (prepare() applies it.)"""
        if self.auto_wrap_policy == "TRANSFORMER_AUTO_WRAP":
            if not self.transformer_cls_names_to_wrap:
                self.transformer_cls_names_to_wrap = list(getattr(model, "_no_split_modules", None) or [])
            present = {type(m).__name__ for m in model.modules()}
            for name in self.transformer_cls_names_to_wrap:
                if name not in present:
                    raise ValueError(f"Could not find the transformer layer class {name} in the model.")
        elif self.auto_wrap_policy == "SIZE_BASED_WRAP" and self.min_num_params <= 0:
            self.auto_wrap_policy = "NO_WRAP"

    @classmethod
    def from_config(cls, config: dict) -> "FullyShardedDataParallelPlugin":
        keys = {"sharding_strategy": "fsdp_sharding_strategy", "auto_wrap_policy": "fsdp_auto_wrap_policy",
                "transformer_cls_names_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
                "min_num_params": "fsdp_min_num_params", "cpu_offload": "fsdp_cpu_offload",
                "activation_checkpointing": "fsdp_activation_checkpointing",
                "state_dict_type": "fsdp_state_dict_type", "sync_each_microstep": "fsdp_sync_each_microstep",
                "reshard_after_forward": "fsdp_reshard_after_forward",
                "sync_module_states": "fsdp_sync_module_states",
                "cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading"}
        return cls(**{mine: config[theirs] for mine, theirs in keys.items() if config.get(theirs) is not None})


def _offload(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in (None, "none", "None", ""):
        return False
    if value == "cpu":
        return True
    raise HpcError(f"{name}={value!r} is not supported", fix="use 'cpu' or 'none' (NVMe offload is not wired up)")


@dataclass
class DeepSpeedPlugin:
    zero_stage: int = 2
    offload_optimizer: bool = False
    offload_param: bool = False
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    hf_ds_config: dict | str | None = None  # a DeepSpeed JSON (path or dict); our values fill its "auto"s
    # Accelerate's device spellings ("cpu" / "none") for the two offloads
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.zero_stage not in (0, 1, 2, 3):
            raise HpcError(f"zero_stage={self.zero_stage!r} is not a ZeRO stage", fix="use 0, 1, 2 or 3")
        self.offload_optimizer = _offload("offload_optimizer", self.offload_optimizer_device or self.offload_optimizer)
        self.offload_param = _offload("offload_param", self.offload_param_device or self.offload_param)
        if self.offload_param and self.zero_stage != 3:
            raise HpcError("offload_param needs ZeRO stage 3", fix="set zero_stage=3 or drop offload_param")

    @property
    def deepspeed_config(self) -> dict:
        """The DeepSpeed JSON as given (before hpc fills its "auto"s): scripts look for "optimizer"/"scheduler"
        in it to choose DummyOptim and DummyScheduler."""
        from hpc.runtime.strategies.deepspeed_config import _load

        return _load(self.hf_ds_config)

    @classmethod
    def coerce(cls, value: "DeepSpeedPlugin | dict") -> "DeepSpeedPlugin":
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise HpcError(f"deepspeed_plugin={value!r} is neither a DeepSpeedPlugin nor a dict",
                           fix='pass DeepSpeedPlugin(zero_stage=2) or {"zero_stage": 2}')
        known = set(cls.__dataclass_fields__) - {"extra"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise HpcError(f"deepspeed_plugin key {unknown[0]!r} is not known", fix=f"use {', '.join(sorted(known))}")
        return cls(**value)

    @classmethod
    def from_config(cls, config: dict) -> "DeepSpeedPlugin":
        keys = {"zero_stage": "zero_stage", "offload_optimizer": "offload_optimizer", "offload_param": "offload_param",
                "gradient_clipping": "gradient_clipping", "hf_ds_config": "deepspeed_config"}
        return cls(**{mine: config[theirs] for mine, theirs in keys.items() if config.get(theirs) is not None})
