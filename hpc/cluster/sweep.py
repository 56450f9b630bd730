"""Sweep files: a grid or a list of overrides, each becoming one task of ONE array job.

    grid:                 list:
      lr: [1e-3, 3e-4]      - {lr: 1e-3}
      batch: [16, 32]       - {lr: 3e-4, batch: 32}

Each task's overrides reach the script as ``--key=value`` arguments, after the job's own arguments.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

from hpc.cluster.config import files
from hpc.cluster.config.profiles import read_yaml
from hpc.errors import MISSING, ConfigError, HpcError, shown

MAX_TASKS = 10_000  # tasks of one sweep; each is an array task, and SLURM's own default limit is 1001
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def _text(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _check_override(path: str, key: str, value) -> None:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ConfigError(path, str(key), value, "is not an argument name", "use letters, digits, '_', '.', '-'")
    if isinstance(value, (dict, list)) or value is None:
        raise ConfigError(path, key, value, "must be a single value", "write one number or string per task")


def load(path: str | Path) -> list[dict[str, str]]:
    """The overrides of each task, in task order."""
    path = Path(path)
    if not files.is_file(path):
        raise HpcError(f"sweep file {shown(str(path))} does not exist", fix="check the --sweep path")
    data = read_yaml(path)
    extra = set(data) - {"grid", "list"}
    if extra or len(data) != 1:
        key = sorted(extra)[0] if extra else "grid"
        raise ConfigError(str(path), key, data.get(key), "a sweep file holds exactly one of 'grid' or 'list'",
                          "write 'grid: {name: [values]}' or 'list: [{name: value}]'")
    if "grid" in data:
        grid = data["grid"]
        if not isinstance(grid, dict) or not grid:
            raise ConfigError(str(path), "grid", grid, "must map names to lists of values",
                              "write grid: {lr: [0.1, 0.01]}")
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(str(path), f"grid.{key}", values, "must be a non-empty list", "write [a, b]")
            for v in values:
                _check_override(str(path), key, v)
        points = math.prod(len(values) for values in grid.values())
        if points > MAX_TASKS:  # counted, not built: 1000 x 1000 x 1000 is a billion tasks
            sizes = " x ".join(str(len(values)) for values in grid.values())
            raise ConfigError(str(path), "grid", MISSING, f"makes {sizes} = {points} tasks, more than {MAX_TASKS}",
                              "sweep fewer values per name, or split it into several sweeps")
        keys = list(grid)
        tasks = [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]
    else:
        tasks = data["list"]
        if not isinstance(tasks, list) or not tasks or not all(isinstance(t, dict) for t in tasks):
            raise ConfigError(str(path), "list", tasks, "must be a non-empty list of mappings", "write - {lr: 0.1}")
        if len(tasks) > MAX_TASKS:
            raise ConfigError(str(path), "list", MISSING, f"holds {len(tasks)} tasks, more than {MAX_TASKS}",
                              "split it into several sweeps")
        for i, task in enumerate(tasks):
            for key, v in task.items():
                _check_override(f"{path} list[{i}]", key, v)
    return [{k: _text(v) for k, v in task.items()} for task in tasks]


def as_args(overrides: dict[str, str]) -> list[str]:
    return [f"--{k}={v}" for k, v in overrides.items()]
