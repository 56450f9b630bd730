"""The runtime config: what a job's processes read back of the job (``$HPC_RUNTIME_CONFIG``, ``runtime.json``).

Written at submit by the backend's plan, read in the job by the Accelerator and by ``hpc launch``. One typed
shape, checked on read: a file from another hpc version, or a damaged one, is a one-line error naming the file.
Torch-free.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from hpc.contract import layout
from hpc.contract.launch_settings import FastTier, Launcher, Preemption, Vetting
from hpc.contract.training import TrainingSettings, training_values
from hpc.contract.validate import build, to_plain
from hpc.errors import HpcError

VERSION = 2


@dataclass(repr=False, eq=False, kw_only=True)
class RuntimeConfig(TrainingSettings):
    version: int = VERSION
    profile: str = ""
    scheduler: str = ""
    job_name: str = ""
    launcher: Launcher = "srun"
    nodes: int = 1
    nproc_per_node: int = 1
    elastic: str | None = None
    max_restarts: int = 0
    preemption: Preemption = field(default_factory=Preemption)
    vetting: Vetting = field(default_factory=Vetting)
    fast_tier: FastTier = field(default_factory=FastTier)
    health_check: list[str] = field(default_factory=list)
    spare_nodes: int = 0
    # the fewest nodes a requeue may run the job on (None: exactly `nodes`); an attempt's own count is SLURM's
    min_nodes: int | None = None
    # only where the scheduler sends the warning signal ahead of a time limit is the lead time worth checking
    warns_before_limit: bool = False
    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    network_interface: str | None = None

    def as_dict(self) -> dict:
        """Flat, without the unset training keys (what the readers look keys up in)."""
        return {k: v for k, v in to_plain(self).items() if k in _OWN_KEYS or v is not None}

    def write(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            f.write(json.dumps(self.as_dict(), indent=2) + "\n")


_OWN_KEYS = [k for k in RuntimeConfig.__dataclass_fields__ if k not in TrainingSettings.__dataclass_fields__]


def from_effective(effective, warns_before_limit: bool) -> RuntimeConfig:
    job, profile = effective.job, effective.profile
    return RuntimeConfig(
        profile=profile.name, scheduler=profile.scheduler, job_name=job.job_name, launcher=job.launcher,
        nodes=job.nodes, nproc_per_node=job.nproc_per_node, elastic=job.elastic, max_restarts=job.max_restarts,
        preemption=profile.preemption, vetting=profile.vetting, fast_tier=profile.fast_tier,
        health_check=profile.health_check,
        spare_nodes=job.spare_nodes, min_nodes=job.min_nodes, warns_before_limit=warns_before_limit,
        mixed_precision=job.mixed_precision,
        gradient_accumulation_steps=job.gradient_accumulation_steps, network_interface=profile.network_interface,
        **training_values(job))


def read(path: str | os.PathLike) -> RuntimeConfig:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise HpcError(f"cannot read the runtime config {path}: {e}",
                       fix=f"unset {layout.RUNTIME_CONFIG_ENV}, or point it at the job's "
                           f"{layout.RUNTIME_CONFIG}") from None
    if not isinstance(data, dict):
        raise HpcError(f"the runtime config {path} is not a JSON object", fix="resubmit the job")
    if data.get("version") == 1:  # a job submitted before the upgrade, requeued after it: carry on
        data = {**data, "version": VERSION, "warns_before_limit": data.get("scheduler") == "slurm"}
    if data.get("version") != VERSION:
        raise HpcError(f"the runtime config {path} has version {data.get('version')!r}; this hpc reads {VERSION}",
                       fix="resubmit the job with this hpc, or run it with the hpc that submitted it")
    return build(RuntimeConfig, data, source=str(path))


def current() -> dict:
    """This process's runtime config as a flat dict; empty outside an hpc job."""
    path = os.environ.get(layout.RUNTIME_CONFIG_ENV)
    if not path:
        return {}
    return read(path).as_dict()


def current_config() -> RuntimeConfig | None:
    """This process's runtime config, typed (its defaults are the dataclass's); None outside an hpc job."""
    path = os.environ.get(layout.RUNTIME_CONFIG_ENV)
    return read(path) if path else None
