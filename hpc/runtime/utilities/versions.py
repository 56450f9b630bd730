"""`accelerate.utils.versions`: compare an installed package's version (or a version string) with another."""

from __future__ import annotations

import importlib.metadata
import operator

from packaging.version import Version, parse

STR_OPERATION_TO_FUNC = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
                         "<=": operator.le, "<": operator.lt}


def compare_versions(library_or_version, operation: str, requirement_version: str) -> bool:
    """``compare_versions("torch", ">=", "2.0")``: a package name is looked up, a Version is taken as it is."""
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(f"`operation` must be one of {list(STR_OPERATION_TO_FUNC)}, received {operation}")
    if isinstance(library_or_version, str):
        library_or_version = parse(importlib.metadata.version(library_or_version))
    return STR_OPERATION_TO_FUNC[operation](library_or_version, parse(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    import torch

    return compare_versions(Version(Version(torch.__version__).base_version), operation, version)
