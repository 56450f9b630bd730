"""One backend per scheduler: everything scheduler-specific, from a job's plan to its states, logs and cancel.

The profile's ``scheduler`` names the backend (``get``); a job record names the one that submitted it
(``for_record``). What a scheduler takes of a job's keys is asked while the job is resolved, below this package
(``hpc.cluster.config.scheduler_keys``): the backends plan from the resolved job, so config cannot ask them.
"""

from __future__ import annotations

import importlib

from hpc.cluster.backends.base import Backend, Plan

_BACKENDS = {"local": "hpc.cluster.backends.local:LocalBackend", "slurm": "hpc.cluster.backends.slurm:SlurmBackend"}
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


_remote: dict[str, Backend] = {}


def _over_ssh(remote) -> Backend:
    """A cluster reached over SSH: one backend (and one connection) per login node and settings."""
    from hpc.cluster.backends.remote import RemoteSlurmBackend

    key = repr(remote)
    if key not in _remote:
        _remote[key] = RemoteSlurmBackend(remote)
    return _remote[key]


def for_record(record) -> Backend:
    if record.remote:
        from hpc.cluster.config.schema import Remote
        from hpc.contract.validate import build

        return _over_ssh(build(Remote, record.remote, source=f"the record of job {record.job_id}"))
    return get(record.scheduler)


def for_profile(profile) -> Backend:
    from hpc.cluster.config.scheduler_keys import scheduler

    name = scheduler(profile)  # refuses a remote that is not SLURM
    return _over_ssh(profile.remote) if profile.remote is not None else get(name)


__all__ = ["Backend", "Plan", "get", "for_record", "for_profile", "names"]
