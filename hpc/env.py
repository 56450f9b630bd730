"""`hpc.env`: how this process was started (torchrun, srun, submitit, DeepSpeed, local), torch-free: `detect()`.

Defined in hpc.contract.launch_env; this path is the public one (and jobs queued before the move import it)."""

from hpc.contract.launch_env import (
    LOOPBACK,
    STANDARD_VARIABLES,
    DistEnv,
    detect,
    export,
    tasks_on_node,
    validate,
)

__all__ = ['DistEnv', 'LOOPBACK', 'STANDARD_VARIABLES', 'detect', 'export', 'tasks_on_node', 'validate']
