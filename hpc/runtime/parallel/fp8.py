"""mixed_precision="fp8": Accelerate's recipe kwargs and backends, and the model conversion.

Backends, as Accelerate names them: "AO" (torchao's Float8Linear, the default where torchao is installed), "TE"
(TransformerEngine) and "MSAMP". hpc drives torchao: every eligible nn.Linear becomes a Float8Linear, whose matmuls
run in fp8 with dynamic scaling while its weights and optimizer state stay in full precision, and which composes
with FSDP2 (with enable_fsdp_float8_all_gather the shards are gathered in fp8: half the bytes of bf16). TE and
MS-AMP are refused in one line saying why and what to use.

fp8 matmuls need fp8 tensor cores: a GPU of compute capability 8.9 or newer (H100, H200, L4, L40, B200). On any
other device the Accelerator refuses fp8 in one line, before anything is trained; the conversion itself needs no
GPU (tests/unit/test_fp8.py converts on the CPU).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable

from hpc.errors import HpcError
from hpc.runtime.handlers import KwargsHandler

BACKENDS = ("AO", "TE", "MSAMP")


@dataclass
class AORecipeKwargs(KwargsHandler):
    """torchao's recipe: ``config`` a torchao Float8LinearConfig (None: its default, dynamic tensorwise scaling),
    ``module_filter_func(module, name) -> bool`` which Linear layers to convert (None: Accelerate's default, all but
    the first and the last, and only those whose dimensions divide by 16)."""

    config: Any = None
    module_filter_func: Callable | None = None


@dataclass
class TERecipeKwargs(KwargsHandler):
    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple | None = None


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    opt_level: str | None = None


@dataclass
class FP8RecipeKwargs(KwargsHandler):
    """Accelerate's older, all-in-one recipe: ``backend`` picks one of the three."""

    backend: str | None = None
    options: dict = field(default_factory=dict)


RECIPES = (AORecipeKwargs, TERecipeKwargs, MSAMPRecipeKwargs, FP8RecipeKwargs)


def backend_of(handlers: dict, asked: str | None = None) -> str:
    """The fp8 backend: the recipe given, else ``asked`` (Accelerate's fp8_backend setting), else torchao."""
    if TERecipeKwargs in handlers or MSAMPRecipeKwargs in handlers:
        asked = "TE" if TERecipeKwargs in handlers else "MSAMP"
    elif AORecipeKwargs in handlers:
        asked = "AO"
    elif FP8RecipeKwargs in handlers and handlers[FP8RecipeKwargs].backend:
        asked = handlers[FP8RecipeKwargs].backend
    asked = (asked or "AO").upper()
    if asked not in BACKENDS:
        raise HpcError(f"fp8 backend {asked!r} is not one of Accelerate's", fix=f"use one of {', '.join(BACKENDS)}")
    if asked == "MSAMP":
        raise HpcError("fp8 with MS-AMP is not driven by hpc: it rebuilds the model and optimizer through its own "
                       "msamp.initialize; hpc's fp8 is torchao's", fix="use torchao (AORecipeKwargs, the default)")
    if asked == "TE":
        raise HpcError("fp8 with TransformerEngine is not driven by hpc yet: it replaces layers with TE's own and "
                       "wraps every forward in fp8_autocast", fix="use torchao (AORecipeKwargs, the default)")
    if importlib.util.find_spec("torchao") is None:
        raise HpcError("mixed_precision='fp8' uses torchao, which is not installed", fix="pip install torchao")
    return asked


def check_device(device) -> None:
    """fp8 matmuls need fp8 tensor cores; elsewhere they are refused before anything is trained."""
    import torch

    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9):
        return
    what = device.type if device.type != "cuda" else f"{torch.cuda.get_device_name(device)} " \
        f"(compute capability {'.'.join(map(str, torch.cuda.get_device_capability(device)))})"
    raise HpcError(f"mixed_precision='fp8': its matmuls need a GPU with fp8 tensor cores (compute capability 8.9 or "
                   f"newer: H100, H200, L4, B200); this process runs on {what}",
                   fix="use bf16 here, and fp8 on a profile with such GPUs")


def first_and_last_excluded(model):
    """Accelerate's default filter: every Linear but the first and the last (the embedding's neighbour and the
    output head are sensitive to fp8's range), and only those whose dimensions divide by 16 (fp8 kernels' tiles)."""
    import torch

    names = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    ends = {names[0], names[-1]} if names else set()

    def keep(module, name: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and name not in ends
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)

    return keep


def convert(model, recipe: AORecipeKwargs | None = None, *, fsdp_all_gather: bool = False):
    """Every eligible Linear of ``model`` made a torchao Float8Linear, in place (the parameters stay the same
    objects: an optimizer built on them goes on). ``fsdp_all_gather``: shards are all-gathered in fp8 under FSDP2."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    recipe = recipe or AORecipeKwargs()
    config = recipe.config or Float8LinearConfig()
    if fsdp_all_gather and not config.enable_fsdp_float8_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    keep = recipe.module_filter_func or first_and_last_excluded(model)
    return convert_to_float8_training(model, config=config, module_filter_fn=keep)
