"""What each scheduler takes of a job's keys, asked while the job is resolved so that a refusal names the file,
variable or flag that set the key.

Here, below the backends, because the backends plan from the resolved job: precedence cannot ask them without
an import cycle. Each rule is the scheduler's own limit (SLURM's MaxArraySize, this machine's processes).
"""

from __future__ import annotations

from hpc.contract import checks
from hpc.errors import HpcError
from hpc.slurm import array_spec


def scheduler(profile) -> str:
    """The scheduler the profile's jobs go to; a cluster reached over SSH is reached through SLURM's clients."""
    if profile.remote is not None and profile.scheduler != "slurm":
        raise HpcError(f"profile {profile.name}: remote needs scheduler slurm", fix="drop remote, or use slurm")
    return profile.scheduler


def _slurm(job, profile) -> tuple[str, str, str] | None:
    if job.array:  # sized before any index is built, against the cluster's MaxArraySize
        try:
            array_spec.parse(job.array, profile.max_array_size or array_spec.DEFAULT_MAX_ARRAY_SIZE)
        except HpcError as e:
            return "array", e.problem, e.fix
    return None


def _local(job, profile) -> tuple[str, str, str] | None:
    if job.nproc_per_node:  # every process runs on this machine: bounded before any starts
        try:
            checks.local_processes(job.nproc_per_node)
        except HpcError as e:
            return "nproc_per_node", e.problem, e.fix
    return None


_RULES = {"slurm": _slurm, "local": _local}


def refused_key(job, profile) -> tuple[str, str, str] | None:
    """A key whose value the profile's scheduler cannot take, as (key, problem, fix); None when it takes them all."""
    return _RULES[scheduler(profile)](job, profile)
