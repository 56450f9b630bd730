"""Where hpc looks for job templates, profiles and its caches: the shipped job_templates/ and cluster_configs/
(installed or in a checkout), the user's own folders, and the current folder's, each only if no other user could
have written it (hpc.cluster.ownership)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpc.cluster.ownership import insecure

_PKG = Path(__file__).resolve().parents[1]  # the hpc package
_noted: set[str] = set()


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
    """Lookup order for profiles and templates: ./NAME, the user's config folder, built-in. A folder another
    user could have written (see ``insecure``) is left out, with a note: its profiles and templates become
    the commands of our jobs."""
    found = []
    for folder in (Path.cwd() / name, user_config_dir() / name):
        why = insecure(folder) if folder.is_dir() else None
        if why is None:
            found.append(folder)
        else:
            note_once(f"hpc: note: ignoring {folder}: {why}")
    return [*found, builtin_dir(name)]


def replaces_builtin(found: Path, builtin: Path) -> bool:
    """Whether ``found`` (a profile or template of ./ or the user's folder) changes what the built-in ``builtin``
    would do: it exists, is another file, and its bytes differ. A copy of the built-in (a checkout's own
    cluster_configs/ beside an installed hpc) replaces nothing worth a note."""
    try:
        if not builtin.is_file() or found.resolve() == builtin.resolve():
            return False
        return found.read_bytes() != builtin.read_bytes()
    except OSError:
        return True


def note_once(line: str) -> None:
    """A line on stderr, once per process (a command renders and loads profiles more than once)."""
    if line not in _noted:
        _noted.add(line)
        print(line, file=sys.stderr)
