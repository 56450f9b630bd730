"""`accelerate.utils.dataclasses`: the enums, configurations, plugins and kwargs handlers scripts import from there.

The configurations, plugins and handlers are hpc.runtime's own, re-exported; only the enums are defined here.
"""

from __future__ import annotations

import enum

from hpc.runtime.compile import TorchDynamoPlugin
from hpc.runtime.configuration import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
from hpc.runtime.handlers import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
)
from hpc.runtime.plugins import DeepSpeedPlugin, FullyShardedDataParallelPlugin


class DistributedType(str, enum.Enum):
    """How this job's processes work together; Accelerate's members and values, so that scripts comparing against
    them (or against their strings: a str subclass) keep working. hpc runs NO, MULTI_CPU, MULTI_GPU, FSDP and
    DEEPSPEED; the other members exist only so that comparisons with them are False instead of AttributeErrors."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


class RNGType(str, enum.Enum):
    """The random number generators synchronize_rng_states knows; hpc synchronizes TORCH, CUDA and GENERATOR."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


__all__ = ["TorchDynamoPlugin", "AutocastKwargs", "DDPCommunicationHookType", "InitProcessGroupKwargs", "KwargsHandler",
           "ProfileKwargs", "DataLoaderConfiguration", "DeepSpeedPlugin", "DistributedDataParallelKwargs",
           "DistributedType", "FullyShardedDataParallelPlugin", "GradScalerKwargs", "GradientAccumulationPlugin",
           "ProjectConfiguration", "RNGType"]
