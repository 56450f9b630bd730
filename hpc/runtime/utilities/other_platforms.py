"""The names of `accelerate.utils` tied to libraries or platforms hpc does not run (Transformer Engine,
bitsandbytes' quantized loading, TPUs through torch_xla). They exist so a script imports: a question answers
truthfully (a model holds no such layers when the library is not even installed), and a call that would need the
platform raises one line saying why and what hpc does instead. torchao's fp8, which hpc does run, is real."""

from __future__ import annotations

import importlib.util

import torch

from hpc.errors import HpcError

_TE_FIX = "use mixed_precision='fp8' (hpc runs fp8 through torchao: AORecipeKwargs)"


def _te_refused(what: str) -> HpcError:
    return HpcError(f"{what}: hpc does not run NVIDIA Transformer Engine (its fp8 backend is torchao)", fix=_TE_FIX)


def convert_model(model, to_transformer_engine: bool = True, _convert_linear: bool = True, _convert_ln: bool = True):
    raise _te_refused("convert_model")


def contextual_fp8_autocast(model_forward, fp8_recipe, use_during_eval: bool = False):
    raise _te_refused("contextual_fp8_autocast")


def apply_fp8_autowrap(model, fp8_recipe_handler):
    raise _te_refused("apply_fp8_autowrap")


def has_transformer_engine_layers(model) -> bool:
    """Whether ``model`` holds Transformer Engine layers (never, where the library is not installed)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    import transformer_engine.pytorch as te

    return any(isinstance(m, (te.LayerNorm, te.Linear, te.TransformerLayer)) for m in model.modules())


def has_4bit_bnb_layers(model) -> bool:
    """Whether ``model`` holds bitsandbytes 4-bit layers (never, where bitsandbytes is not installed)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return False
    import bitsandbytes as bnb

    return any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


def load_and_quantize_model(model, bnb_quantization_config, weights_location=None, device_map=None,
                            no_split_module_classes=None, max_memory=None, offload_folder=None,
                            offload_state_dict: bool = False):
    raise HpcError("load_and_quantize_model: hpc does not quantize models with bitsandbytes",
                   fix="load quantized weights with transformers' from_pretrained(quantization_config=...)")


def install_xla(upgrade: bool = False) -> None:
    raise HpcError("install_xla: hpc does not run on TPUs (torch_xla is not one of its platforms)",
                   fix="run on GPUs or CPUs")


# torchao's fp8 (hpc's own backend): Accelerate's helpers around it
def _first_and_last_linear(model) -> tuple[str | None, str | None]:
    names = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def _filter_linear(module, fqn: str, layers_to_filter) -> bool:
    if isinstance(module, torch.nn.Linear) and (module.in_features % 16 or module.out_features % 16):
        return False  # fp8 kernels work in tiles of 16
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module, fqn: str) -> bool:
    """torchao's module filter: not the first or last Linear of ``module``, and dimensions divisible by 16."""
    return _filter_linear(module, fqn, list(_first_and_last_linear(module)))


def has_ao_layers(model) -> bool:
    if importlib.util.find_spec("torchao") is None:
        return False
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(m, Float8Linear) for m in model.modules())


def convert_model_to_fp8_ao(model, config=None, module_filter_func=None):
    """Every Linear but the first and the last (with dimensions divisible by 16) made torchao's Float8Linear, in
    place."""
    from torchao.float8 import convert_to_float8_training

    ends = list(_first_and_last_linear(model))
    keep = module_filter_func or (lambda module, fqn: _filter_linear(module, fqn, ends))
    convert_to_float8_training(model, module_filter_fn=keep, config=config)
    model.train()
