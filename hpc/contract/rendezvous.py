"""The rendezvous contract, torch-free: MASTER_ADDR is the first host; the port follows from the job id.

The port lies above the Linux ephemeral range (32768-60999) so it cannot collide with a connection
the OS handed out; an existing MASTER_PORT always wins. The job templates compute the same in bash.
"""

from __future__ import annotations

import re

from hpc.contract.layout import PORT_BASE, PORT_SPAN


def port_for(job_id: str | int) -> int:
    digits = re.sub(r"\D", "", str(job_id))[-9:] or "0"
    return int(digits) % PORT_SPAN + PORT_BASE
