"""`accelerate.utils.versions` as hpc spells it: the names accelerate.utils takes from
it, which are hpc.utils's (scripts import them by this path too)."""

from hpc.utils import (
    compare_versions,
    is_torch_version,
)

__all__ = ["compare_versions", "is_torch_version"]
