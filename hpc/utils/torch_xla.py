"""`accelerate.utils.torch_xla` as hpc spells it: the names accelerate.utils takes from
it, which are hpc.utils's (scripts import them by this path too)."""

from hpc.utils import (
    install_xla,
)

__all__ = ["install_xla"]
