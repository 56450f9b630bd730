"""The hosts of this run's nodes, for rank 0's `started` line (hpc status names a lost node and the spare that
replaced it by comparing one round's hosts with the next's).

Through the process group's store, not a collective: a collective would need the device ready (NCCL), and this
runs while the Accelerator starts. Each node's first rank adds its host under the next free number; rank 0 waits
(briefly: every rank passed the process group's start, so the others are there or dead) for one per node.
"""

from __future__ import annotations

import socket
from datetime import timedelta

WAIT = timedelta(seconds=10)  # the other nodes' first ranks are a few store operations behind rank 0, or gone


def node_hosts(process) -> list[str] | None:
    """Rank 0: the run's node hosts, sorted; other ranks, a run of one node, or a store that does not answer:
    None (the line then goes without them)."""
    env = process.env
    per_node = max(1, getattr(env, "local_world_size", 1) or 1)
    if not process.distributed or env.world_size <= per_node:
        return [socket.gethostname()] if process.is_main_process else None
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        if process.is_local_main_process:
            slot = store.add("hpc/node_hosts/n", 1)
            store.set(f"hpc/node_hosts/{slot}", socket.gethostname())
        if not process.is_main_process:
            return None
        keys = [f"hpc/node_hosts/{i}" for i in range(1, env.world_size // per_node + 1)]
        store.wait(keys, WAIT)
        return sorted(store.get(key).decode() for key in keys)
    except Exception:  # noqa: BLE001 - a line without its hosts costs `hpc status` one detail, never the run
        return None
