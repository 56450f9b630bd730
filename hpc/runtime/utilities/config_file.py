"""`accelerate.utils.write_basic_config` (also `accelerate.commands.config.default`): a basic Accelerate config
file for this machine, which `hpc launch` reads as Accelerate's launcher does (its default location, or
--config_file)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def accelerate_cache_dir() -> Path:
    # Accelerate's: $HF_HOME/accelerate, HF_HOME defaulting to $XDG_CACHE_HOME/huggingface then ~/.cache/huggingface
    # (hpc.cluster.config.accelerate_file reads from the same place)
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(os.path.expanduser(os.environ.get("HF_HOME") or os.path.join(cache, "huggingface"))) / "accelerate"


def default_json_config_file() -> Path:
    # Accelerate names it .yaml and writes JSON into it (JSON is YAML): hpc launch reads it either way
    return accelerate_cache_dir() / "default_config.yaml"


def write_basic_config(mixed_precision: str = "no", save_location: str | None = None) -> Path | bool:
    """Writes ``{"compute_environment": "LOCAL_MACHINE", "mixed_precision": ..., "num_processes": <GPUs or 1>,
    "distributed_type": ...}`` as JSON; an existing file is left alone (False returned), as Accelerate does."""
    import torch

    path = Path(save_location) if save_location is not None else default_json_config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        print(f"Configuration already exists at {path}, will not override. Run `accelerate config` manually or "
              "pass a different `save_location`.")
        return False
    mixed_precision = mixed_precision.lower()
    if mixed_precision not in ("no", "fp16", "bf16", "fp8"):
        raise ValueError(f"`mixed_precision` should be one of 'no', 'fp16', 'bf16', or 'fp8'. "
                         f"Received {mixed_precision}")
    config = {"compute_environment": "LOCAL_MACHINE", "mixed_precision": mixed_precision}
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        config.update(num_processes=gpus, use_cpu=False, distributed_type="MULTI_GPU" if gpus > 1 else "NO")
    else:
        config.update(num_processes=1, use_cpu=True, distributed_type="NO")
    config["debug"] = False
    config["enable_cpu_affinity"] = False
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path
