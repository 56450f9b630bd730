"""At submit: does the profile's fast tier (checkpoints in node memory, docs/checkpoint-tiers.md) fit in the node
memory the job gets? The accounting is `hpc estimate-memory`'s (hpc.cluster.estimate), for the state per rank the
user gives (`hpc submit --state-size`). Not fitting is a warning, not a refusal: in the job a fast save that does
not fit falls back to the shared tier in one line, and the job never fails for it. Torch-free."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from hpc.cluster import estimate as est
from hpc.slurm import formats

if TYPE_CHECKING:
    from hpc.cluster.config.effective import Effective

# the job's strategy keys whose state the fast tier does not write (sharded: the shared tier only)
SHARDED = ("fsdp", "deepspeed")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def node_memory(job) -> tuple[int, str] | None:
    """The memory one node of the job gets, in bytes, and how the job asks for it (mem, or mem_per_gpu times the
    GPUs of a node); None where neither says."""
    if job.mem:
        return formats.parse_memory(job.mem) * 2**20, f"mem {job.mem}"
    if job.mem_per_gpu and job.gpus_per_node:
        per_gpu = formats.parse_memory(job.mem_per_gpu) * 2**20
        return per_gpu * job.gpus_per_node, f"mem_per_gpu {job.mem_per_gpu} x {job.gpus_per_node} GPUs"
    return None


def check(effective: Effective, state_bytes: int | None) -> dict | None:
    """What `hpc submit --json` carries as ``fast_tier``: the bytes per node the fast tier needs for ``state_bytes``
    a rank, against the node memory the job gets (``fits`` None where it is not known). None where there is nothing
    to check: no state size, the fast tier off, or a sharded strategy (not written to the fast tier). Says one
    warning line on stderr when it does not fit."""
    settings, job = effective.profile.fast_tier, effective.job
    if state_bytes is None or not settings.enabled or job.strategy in SHARDED:
        return None
    replicas = settings.replicas if job.nodes > 1 else 1  # one node has no next node to keep a copy on
    need = est.fast_tier_node_bytes(state_bytes, replicas)
    memory = node_memory(job)
    fit = {**est.fast_tier_fit(need, memory[0] if memory else None), "state_bytes": state_bytes,
           "replicas": replicas}
    if fit["fits"] is False:
        print(f"hpc: warning: the fast tier needs {_gib(need)} of node memory per node ({_gib(state_bytes)} of state "
              f"a rank x {replicas} replica(s) x {est.FAST_TIER_FOLDERS} folders) and the job gets {memory[1]} "
              f"({_gib(memory[0])}) a node: its saves would fall back to the shared tier; fix: "
              f"{est.FAST_TIER_FIX}, or ask for more memory (--mem)", file=sys.stderr)
    return fit
