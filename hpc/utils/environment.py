"""`accelerate.utils.environment` as hpc spells it: the names accelerate.utils takes from
it, which are hpc.utils's (scripts import them by this path too)."""

from hpc.utils import (
    are_libraries_initialized,
    check_cuda_fp8_capability,
    check_cuda_p2p_ib_support,
    clear_environment,
    convert_dict_to_env_variables,
    get_cpu_distributed_information,
    get_current_device_type,
    get_gpu_info,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    set_numa_affinity,
    str_to_bool,
)

__all__ = [
    "are_libraries_initialized",
    "check_cuda_fp8_capability",
    "check_cuda_p2p_ib_support",
    "clear_environment",
    "convert_dict_to_env_variables",
    "get_cpu_distributed_information",
    "get_current_device_type",
    "get_gpu_info",
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "set_numa_affinity",
    "str_to_bool",
]
