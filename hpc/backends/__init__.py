"""One backend per scheduler: everything scheduler-specific, from a job's plan to its states, logs and cancel.

The profile's ``scheduler`` names the backend (``get``); a job record names the one that submitted it
(``for_record``). Nothing outside this package asks which scheduler it is.
"""

from __future__ import annotations

import importlib

from hpc.backends.base import Backend, Plan

_BACKENDS = {"local": "hpc.backends.local:LocalBackend", "slurm": "hpc.backends.slurm:SlurmBackend"}
_made: dict[str, Backend] = {}


def names() -> list[str]:
    return sorted(_BACKENDS)


def get(name: str) -> Backend:
    if name not in _made:
        try:
            module, _, cls = _BACKENDS[name].partition(":")
        except KeyError:
            from hpc.errors import HpcError

            raise HpcError(f"no backend for scheduler {name!r}", fix=f"use one of {', '.join(names())}") from None
        _made[name] = getattr(importlib.import_module(module), cls)()
    return _made[name]


def for_record(record) -> Backend:
    return get(record.scheduler)


def for_profile(profile) -> Backend:
    return get(profile.scheduler)


__all__ = ["Backend", "Plan", "get", "for_record", "for_profile", "names"]
