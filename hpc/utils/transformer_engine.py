"""`accelerate.utils.transformer_engine` as hpc spells it: the names accelerate.utils takes from
it, which are hpc.utils's (scripts import them by this path too)."""

from hpc.utils import (
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
)

__all__ = ["apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model", "has_transformer_engine_layers"]
