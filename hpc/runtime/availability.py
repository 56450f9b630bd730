"""`accelerate.utils.imports`: whether optional packages (and a GPU) are here, without importing the packages; and
DeepSpeed imported the one way hpc needs it (the strategy and merge-weights both use it)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import warnings

__all__ = ["is_bf16_available", "is_cuda_available", "is_datasets_available", "is_deepspeed_available",
           "is_fp16_available", "is_fp8_available", "is_hpu_available", "is_mlu_available", "is_mps_available",
           "is_npu_available", "is_pytest_available", "is_rich_available", "is_schedulefree_available",
           "is_tensorboard_available", "is_torch_xla_available", "is_transformers_available", "is_wandb_available",
           "is_xpu_available"]


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def is_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def is_deepspeed_available() -> bool:
    return _installed("deepspeed")


def is_transformers_available() -> bool:
    return _installed("transformers")


def is_datasets_available() -> bool:
    return _installed("datasets")


def is_tensorboard_available() -> bool:
    return _installed("tensorboard") or _installed("tensorboardX")


def is_wandb_available() -> bool:
    return _installed("wandb")


def is_rich_available() -> bool:
    return _installed("rich")


def is_schedulefree_available() -> bool:
    return _installed("schedulefree")


def is_pytest_available() -> bool:
    return _installed("pytest")


def is_mps_available() -> bool:
    import torch

    return torch.backends.mps.is_available() and torch.backends.mps.is_built()


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """bf16 autocast works here: on CPUs always, on GPUs from Ampere on."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return True


def is_fp16_available() -> bool:
    return True


def is_fp8_available() -> bool:
    """Whether mixed_precision="fp8" can run here: torchao installed and a GPU with fp8 tensor cores (compute
    capability 8.9 or newer), as hpc's fp8 needs (fp8.py)."""
    import torch

    return importlib.util.find_spec("torchao") is not None and torch.cuda.is_available() and \
        torch.cuda.get_device_capability() >= (8, 9)


# Accelerators hpc does not run on: always False, so a script's branches for them are not taken.
def is_hpu_available(init_hccl: bool = False) -> bool:
    return False


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    return False


def is_xpu_available(check_device: bool = False) -> bool:
    return False


def is_npu_available(check_device: bool = False) -> bool:
    return False


def is_mlu_available(check_device: bool = False) -> bool:
    return False


def import_deepspeed(device_type: str):
    if device_type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    with _not_imported(_UNUSED_BY_DEEPSPEED):
        import deepspeed
        import deepspeed.ops

    # The CPU accelerator JIT-compiles a shared-memory all-reduce (~30 s cold) used only by inference;
    # training all-reduces through the torch process group, so it is not built.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    # ZeRO calls the old collective names on every step: one warning per call would flood the job's log
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use `torch\.distributed\.",
                            category=FutureWarning)
    return deepspeed


# DeepSpeed's autotuner imports mlflow where it is installed, to log its trials: 2.8 of `import deepspeed`'s 3.6 s
# here, in every rank of every start. hpc never runs the autotuner, so DeepSpeed is imported without it; a script
# that imports mlflow itself, before or after, gets it as usual.
_UNUSED_BY_DEEPSPEED = ("mlflow",)


@contextlib.contextmanager
def _not_imported(names: tuple[str, ...]):
    """Inside the block, `import name` fails with ImportError for each name not imported yet (None in
    sys.modules); afterwards it imports as usual."""
    blocked = [name for name in names if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None
    try:
        yield
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
