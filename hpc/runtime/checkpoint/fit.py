"""Whether a checkpoint's tensors fit the model being resumed, said in one line before anything is loaded.

A model changed between two runs of a job (a layer resized, renamed or added) would otherwise fail deep inside
load_state_dict or DCP's planner, with a traceback per rank; the line names the folder, the keys and both shapes.
"""

from __future__ import annotations

from pathlib import Path

from hpc.errors import HpcError

_SHOWN = 3  # keys named in the line; the rest are counted


def _shape(value) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return tuple(int(n) for n in shape) if shape is not None else None


def check(folder: Path, what: str, saved: dict, model: dict, whole: set | None = None) -> None:
    """``saved`` and ``model``: key -> tensor (or anything with a shape; None for a non-tensor entry). ``whole``:
    the keys of the whole model where this rank holds a part of it (a pipeline stage): the checkpoint's other keys
    are other stages', not extra."""
    problems = []
    for key, value in model.items():
        if key not in saved:
            problems.append(f"{key} is missing from the checkpoint")
            continue
        have, want = _shape(saved[key]), _shape(value)
        if have is not None and want is not None and have != want:
            problems.append(f"{key} is {list(have)} in the checkpoint, {list(want)} in the model")
    whole = set(model) if whole is None else whole
    problems += [f"{key} is in the checkpoint, not in the model" for key in saved if key not in whole]
    if not problems:
        return
    more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
    raise HpcError(f"{folder}: the checkpoint does not fit {what}: {'; '.join(problems[:_SHOWN])}{more}",
                   fix="resume with the model that wrote it, or start afresh in another project_dir")
