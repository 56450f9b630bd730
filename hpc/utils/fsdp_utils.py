"""`accelerate.utils.fsdp_utils` as hpc spells it: the names accelerate.utils takes from
it, which are hpc.utils's (scripts import them by this path too)."""

from hpc.utils import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_apply_ac,
    fsdp2_canonicalize_names,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
    load_fsdp_model,
    load_fsdp_optimizer,
    merge_fsdp_weights,
    save_fsdp_model,
    save_fsdp_optimizer,
)

__all__ = [
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]
