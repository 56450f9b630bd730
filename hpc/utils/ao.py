"""`accelerate.utils.ao` as hpc spells it: the names accelerate.utils takes from
it, which are hpc.utils's (scripts import them by this path too)."""

from hpc.utils import (
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    has_ao_layers,
)

__all__ = ["convert_model_to_fp8_ao", "filter_first_and_last_linear_layers", "has_ao_layers"]
