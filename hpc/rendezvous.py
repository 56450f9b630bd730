"""The rendezvous contract, torch-free: MASTER_ADDR is the first host; the port follows from the job id.

The port lies above the Linux ephemeral range (32768-60999) so it cannot collide with a connection
the OS handed out; an existing MASTER_PORT always wins. The job templates compute the same in bash.
"""

from __future__ import annotations

import os
import re

PORT_BASE = 61000
PORT_SPAN = 4536  # 61000 + 4535 = 65535


def port_for(job_id: str | int) -> int:
    digits = re.sub(r"\D", "", str(job_id))[-9:] or "0"
    return int(digits) % PORT_SPAN + PORT_BASE


def export_from_submitit() -> None:
    """Inside a submitit task: set the standard variables from submitit's own view of the job."""
    from submitit import JobEnvironment

    env = JobEnvironment()
    job_id = os.environ.get("SLURM_JOB_ID") or env.job_id
    values = {
        # no SLURM: the local executor's processes share this machine
        "MASTER_ADDR": env.hostnames[0] if "SLURM_JOB_ID" in os.environ else "127.0.0.1",
        "MASTER_PORT": os.environ.get("MASTER_PORT") or str(port_for(job_id)),
        "RANK": str(env.global_rank),
        "WORLD_SIZE": str(env.num_tasks),
        "LOCAL_RANK": str(env.local_rank),
        "LOCAL_WORLD_SIZE": str(env.num_tasks // env.num_nodes),
        "NODE_RANK": str(env.node),
    }
    os.environ.update(values)
