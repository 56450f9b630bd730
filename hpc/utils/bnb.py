"""`accelerate.utils.bnb` as hpc spells it: the names accelerate.utils takes from
it, which are hpc.utils's (scripts import them by this path too)."""

from hpc.utils import (
    has_4bit_bnb_layers,
    load_and_quantize_model,
)

__all__ = ["has_4bit_bnb_layers", "load_and_quantize_model"]
