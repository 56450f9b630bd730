"""Accelerate's config files (what `accelerate config` writes, YAML or JSON) as a layer of hpc's precedence.

Found where Accelerate finds them: ``--config_file PATH``, else ``$HF_HOME/accelerate/default_config.yaml``
(``HF_HOME`` defaults to ``$XDG_CACHE_HOME/huggingface``, then ``~/.cache/huggingface``). Torch-free.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hpc.cluster.config import files
from hpc.errors import HpcError, shorten, shown


def default_path(environ=None) -> Path | None:
    """Accelerate's default config file, if there is one."""
    environ = os.environ if environ is None else environ
    cache = environ.get("XDG_CACHE_HOME") or "~/.cache"
    home = Path(os.path.expanduser(environ.get("HF_HOME") or os.path.join(cache, "huggingface")))
    for name in ("default_config.yaml", "default_config.json"):
        if (home / "accelerate" / name).is_file():
            return home / "accelerate" / name
    return None


def read(path: str | Path) -> dict:
    """The file's settings as written (nested mappings kept)."""
    path = Path(path)
    if not files.is_file(path):
        raise HpcError(f"Accelerate config file {shown(str(path))} does not exist",
                       fix="check the --config_file path, or write one with `accelerate config` or `hpc config`")
    if path.suffix != ".json":
        from hpc.cluster.config.profiles import read_yaml

        return read_yaml(path)  # also refuses a file that is not a mapping
    try:
        data = json.loads(files.read_text(path))  # the same size limit as a YAML file's
    except (ValueError, RecursionError) as e:  # RecursionError: thousands of nested brackets
        problem = str(e) if isinstance(e, ValueError) else "nested too deeply"
        raise HpcError(f"not valid JSON ({shorten(problem, 200)})", where=str(path),
                       fix="fix the JSON syntax there") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise HpcError(f"the Accelerate config file {path} is not a mapping of settings",
                       fix="write it as `accelerate config` does (key: value lines)")
    return data


def translate(path: str | Path, default_file: bool = False, settings: dict | None = None):
    """The file's settings (``settings``: as read() gave them already) in hpc's terms, an
    accelerate_settings.Translation."""
    from hpc.contract import accelerate_settings  # only a job with an Accelerate file pays for the table

    path = Path(path)
    return accelerate_settings.translate(read(path) if settings is None else settings, str(path),
                                         base=path.absolute().parent, default_file=default_file)
