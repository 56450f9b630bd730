"""The rest of `accelerate.utils.imports`: whether an optional package is installed (found, not imported), and
whether a platform is here. Platforms hpc does not run on (XLA, NPU, MLU, MUSA, SDAA, Neuron, HPU, ROCm's extras)
answer False, truthfully: their branches in a script are not taken."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os

from packaging.version import parse


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _version_at_least(distribution: str, floor: str) -> bool:
    try:
        return parse(importlib.metadata.version(distribution)) >= parse(floor)
    except importlib.metadata.PackageNotFoundError:
        return False


def _probe(module: str, name: str | None = None):
    def probe() -> bool:
        return _installed(module)

    probe.__name__ = probe.__qualname__ = f"is_{name or module}_available"
    probe.__doc__ = f"Whether {module} is installed here (found, not imported)."
    return probe


is_aim_available = _probe("aim")
is_boto3_available = _probe("boto3")
is_clearml_available = _probe("clearml")
is_comet_ml_available = _probe("comet_ml")
is_dvclive_available = _probe("dvclive")
is_import_timer_available = _probe("import_timer")
is_lomo_available = _probe("lomo_optim", "lomo")
is_matplotlib_available = _probe("matplotlib")
is_msamp_available = _probe("msamp")
is_pandas_available = _probe("pandas")
is_peft_available = _probe("peft")
# pipelining is in torch itself since 2.4 (Accelerate answers the same)
is_pippy_available = _probe("torch.distributed.pipelining", "pippy")
is_sagemaker_available = _probe("sagemaker")
is_swanlab_available = _probe("swanlab")
is_timm_available = _probe("timm")
is_torchao_available = _probe("torchao")
is_torchdata_available = _probe("torchdata")
is_torchvision_available = _probe("torchvision")
is_trackio_available = _probe("trackio")
is_amdsmi_available = _probe("amdsmi")


def is_pynvml_available() -> bool:
    return _installed("pynvml")


def is_mlflow_available() -> bool:
    return _installed("mlflow") or _installed("mlflow_skinny")


def is_triton_available() -> bool:
    import torch

    return torch.cuda.is_available() and _installed("triton")


def is_transformer_engine_available() -> bool:
    return _installed("transformer_engine")


def is_transformer_engine_mxfp8_available() -> bool:
    if not is_transformer_engine_available():
        return False
    from transformer_engine.pytorch.fp8 import check_mxfp8_support

    return bool(check_mxfp8_support()[0])


def is_bnb_available(min_version: str | None = None) -> bool:
    if not _installed("bitsandbytes"):
        return False
    return min_version is None or _version_at_least("bitsandbytes", min_version)


def is_4bit_bnb_available() -> bool:
    return is_bnb_available("0.39.0")


def is_8bit_bnb_available() -> bool:
    return is_bnb_available("0.37.2")


def is_bitsandbytes_multi_backend_available() -> bool:
    if not is_bnb_available():
        return False
    import bitsandbytes

    return "multi_backend" in getattr(bitsandbytes, "features", set())


def is_torchdata_stateful_dataloader_available() -> bool:
    return _version_at_least("torchdata", "0.8.0")


def is_megatron_lm_available() -> bool:
    """Accelerate's answer: asked for (ACCELERATE_USE_MEGATRON_LM) and megatron-core >= 0.8 installed."""
    if os.environ.get("ACCELERATE_USE_MEGATRON_LM", "false").lower() not in ("1", "true", "yes", "y", "on", "t"):
        return False
    return _installed("megatron") and _version_at_least("megatron-core", "0.8.0")


def is_weights_only_available() -> bool:
    return True  # torch >= 2.4, which hpc requires


def is_xccl_available() -> bool:
    import torch.distributed

    return torch.distributed.is_available() and torch.distributed.distributed_c10d.is_xccl_available()


def is_rocm_available() -> bool:
    import torch

    return torch.version.hip is not None and torch.cuda.is_available()


# platforms hpc does not run on: False here, whatever is installed (hpc's runtime has no path for them)
def is_musa_available(check_device: bool = False) -> bool:
    return False


def is_sdaa_available(check_device: bool = False) -> bool:
    return False


def is_neuron_available(check_device: bool = False) -> bool:
    return False


def is_habana_gaudi1() -> bool:
    return False


def torchao_required(func):
    """A decorator: calling ``func`` without torchao installed raises ImportError naming the install."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if not is_torchao_available():
            raise ImportError("`torchao` is not available, please install it before calling this function via "
                              "`pip install torchao`.")
        return func(*args, **kwargs)

    return wrapper


def deepspeed_required(func):
    """A decorator: calling ``func`` when an Accelerator runs another strategy raises ValueError."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from hpc.runtime.process.distributed_type import DistributedType
        from hpc.runtime.process.state import AcceleratorState, is_initialized

        if is_initialized() and AcceleratorState().distributed_type != DistributedType.DEEPSPEED:
            raise ValueError("DeepSpeed is not enabled, please make sure that an `Accelerator` is configured for "
                             "`deepspeed` before calling this function.")
        return func(*args, **kwargs)

    return wrapper
