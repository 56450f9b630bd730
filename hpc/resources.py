"""Where the shipped job_templates/ and cluster_configs/ are, installed or in a checkout."""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def builtin_dir(name: str) -> Path:
    """``job_templates`` or ``cluster_configs``: inside the installed package, else at the repository top."""
    installed = _PKG / name
    return installed if installed.is_dir() else _PKG.parent / name


def user_config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "hpc"


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpc"


def search_path(name: str) -> list[Path]:
    """Lookup order for profiles and templates: ./NAME, the user's config folder, built-in."""
    return [Path.cwd() / name, user_config_dir() / name, builtin_dir(name)]
