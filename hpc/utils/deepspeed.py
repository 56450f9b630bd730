"""`accelerate.utils.deepspeed` as hpc spells it: the names accelerate.utils takes from
it, which are hpc.utils's (scripts import them by this path too)."""

from hpc.utils import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
    HfDeepSpeedConfig,
    get_active_deepspeed_plugin,
    map_pytorch_optim_to_deepspeed,
)

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
]
