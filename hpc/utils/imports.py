"""`accelerate.utils.imports` as hpc spells it: its names, defined in hpc.runtime.availability."""

from hpc.runtime.availability import (
    is_bf16_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_fp8_available,
    is_fp16_available,
    is_hpu_available,
    is_mlu_available,
    is_mps_available,
    is_npu_available,
    is_pytest_available,
    is_rich_available,
    is_schedulefree_available,
    is_tensorboard_available,
    is_torch_xla_available,
    is_transformers_available,
    is_wandb_available,
    is_xpu_available,
)

__all__ = ['is_bf16_available', 'is_cuda_available', 'is_datasets_available', 'is_deepspeed_available',
           'is_fp16_available', 'is_fp8_available', 'is_hpu_available', 'is_mlu_available', 'is_mps_available',
           'is_npu_available', 'is_pytest_available', 'is_rich_available', 'is_schedulefree_available',
           'is_tensorboard_available', 'is_torch_xla_available', 'is_transformers_available', 'is_wandb_available',
           'is_xpu_available']
