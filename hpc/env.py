"""Kept for jobs queued before the move: `hpc.env.detect` is now hpc.contract.launch_env's."""

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
