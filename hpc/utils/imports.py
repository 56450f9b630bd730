"""`accelerate.utils.imports`: whether optional packages (and a GPU) are here, without importing the packages."""

from __future__ import annotations

import importlib.util

__all__ = ["is_cuda_available", "is_datasets_available", "is_deepspeed_available", "is_rich_available",
           "is_tensorboard_available", "is_transformers_available", "is_wandb_available"]


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
