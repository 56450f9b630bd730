"""Where a rendered job runs: SLURM (sbatch) or this machine. One small interface, chosen by the profile."""

from __future__ import annotations

from hpc.executors.base import Executor


def for_scheduler(scheduler: str) -> Executor:
    if scheduler == "local":
        from hpc.executors.local import LocalExecutor

        return LocalExecutor()
    from hpc.executors.slurm import SlurmExecutor

    return SlurmExecutor()
