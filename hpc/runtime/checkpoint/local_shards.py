"""A sharded model's state (FSDP2's DTensors) as each rank holds it: its local shards as plain tensors, saved in its
own folder of the fast tier and read back into the same layout (the same world size and mesh: a resume at another
world size reads the shared tier, whose DCP checkpoint reshards). Plain tensors and data only: the files load with
weights_only."""

from __future__ import annotations

from pathlib import Path

import torch

from hpc.errors import HpcError
from hpc.runtime.checkpoint import safe_load


def _is_dtensor(value) -> bool:
    return type(value).__name__ == "DTensor" and hasattr(value, "to_local")


def to_local(obj):
    """``obj`` with each DTensor replaced by this rank's shard of it (containers rebuilt, the rest as it is)."""
    if _is_dtensor(obj):
        return obj.to_local()
    if isinstance(obj, dict):
        return {k: to_local(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_local(v) for v in obj)
    return obj


def layout(models) -> str:
    """What a rank's shards fit: every sharded parameter's name, global shape, dtype and placements and its mesh's
    shape, alike on every rank (a short hash; the optimizer's state is laid out as its parameters are, and asking
    for it would give a fresh optimizer state: a step). Folders saved under another layout (another mesh at the
    same world size, another model) are not read: the shared tier's DCP checkpoint reshards."""
    import hashlib

    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    parts = []

    def walk(obj, path: str) -> None:
        if _is_dtensor(obj):
            parts.append(f"{path}:{tuple(obj.shape)}:{obj.dtype}:{obj.placements}:{tuple(obj.device_mesh.shape)}")
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                walk(obj[k], f"{path}/{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{path}/{i}")

    walk({f"model_{i}": get_model_state_dict(m) for i, m in enumerate(models)}, "")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def state(fmt, models, optimizers) -> dict:
    """The files of this rank's shards, named as the checkpointer names them (``fmt``: the DCP format, which
    knows how a model and its optimizer give their sharded state)."""
    whole = fmt._state(models, optimizers)
    return {f"{key}.pt": to_local(value) for key, value in whole.items()}


def read(fmt, folder: Path, models, optimizers, device) -> dict:
    """This rank's shards from ``folder``, as the state ``fmt`` sets (DTensors on the current mesh), each checked
    against the shard this rank holds now (shape and dtype) before any is changed."""
    current = fmt._state(models, optimizers)
    return {key: _merged(value, safe_load.load(folder / f"{key}.pt", map_location=device), f"{folder}: {key}")
            for key, value in current.items()}


def _merged(now, saved, where: str):
    """``saved`` (local shards) in ``now``'s shape: each DTensor rebuilt around its saved shard."""
    if _is_dtensor(now):
        local = now.to_local()
        if not isinstance(saved, torch.Tensor) or saved.shape != local.shape or saved.dtype != local.dtype:
            got = f"{tuple(saved.shape)} {saved.dtype}" if isinstance(saved, torch.Tensor) else type(saved).__name__
            raise HpcError(f"{where}: this rank's shard is {tuple(local.shape)} {local.dtype}, the saved one {got}",
                           fix="resume it with the layout that saved it, or from the shared tier")
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(saved.to(local.device), now.device_mesh, now.placements, shape=now.shape,
                                  stride=now.stride())
    if isinstance(now, dict) and isinstance(saved, dict):
        if set(now) != set(saved):
            odd = sorted(map(str, set(now) ^ set(saved)))[:3]
            raise HpcError(f"{where}: the saved state's keys differ from this run's ({', '.join(odd)})",
                           fix="resume it with the model that saved it, or from the shared tier")
        return {k: _merged(now[k], saved[k], where) for k in saved}
    if isinstance(now, (list, tuple)) and isinstance(saved, (list, tuple)) and len(now) == len(saved):
        return type(now)(_merged(a, b, where) for a, b in zip(now, saved))
    if isinstance(now, torch.Tensor) and isinstance(saved, torch.Tensor):
        return saved.to(now.device)  # where it is now (Adam's step stays on the host: no sync a parameter)
    return saved
