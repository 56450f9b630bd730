"""The enums of `accelerate.utils.dataclasses`: how the job's processes work together (DistributedType) and the
random generators synchronize_rng_states knows (RNGType). hpc.utils.dataclasses re-exports them with the
configurations, plugins and handlers, each from its own module."""

from __future__ import annotations

import enum


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


__all__ = ["DistributedType", "RNGType"]
