"""`accelerate.utils.launch` as hpc spells it: the names accelerate.utils takes from
it, which are hpc.utils's (scripts import them by this path too)."""

from hpc.utils import (
    PrepareForLaunch,
    prepare_deepspeed_cmd_env,
    prepare_multi_gpu_env,
    prepare_sagemager_args_inputs,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
)

__all__ = [
    "PrepareForLaunch",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
]
