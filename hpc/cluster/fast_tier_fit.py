"""At submit: does the profile's fast tier (checkpoints in node memory, docs/checkpoint-tiers.md) fit in the node
memory the job gets? The accounting is `hpc estimate-memory`'s (hpc.cluster.estimate), for the state per rank the
user gives (`hpc submit --state-size`), else the one the newest earlier job of the same name and profile measured
(its timelines' ``progress`` lines: ``fast.bytes``, rank 0's newest fast save). Not fitting is a warning, not a
refusal: in the job a fast save that does not fit falls back to the shared tier in one line, and the job never
fails for it. Torch-free."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from hpc.cluster import estimate as est
from hpc.cluster import records as jobs
from hpc.contract import timeline
from hpc.errors import HpcError
from hpc.slurm import formats

if TYPE_CHECKING:
    from hpc.cluster.config.effective import Effective

# the job's strategy keys whose every rank writes its own shards or files (and "--state-size" is one rank's): a node
# holds all of them
PER_RANK = ("fsdp", "deepspeed")
# the timelines of an earlier job read for its measure: an array's first ones (a remote read is an SSH round trip
# each, and the tasks of one sweep train the same model)
TASKS_READ = 16


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


def _fast_bytes(events: list[dict]) -> list[int]:
    """The sizes of the fast saves the ``progress`` lines of a timeline report (``fast.bytes``, above 0)."""
    out = []
    for event in events:
        fast = event.get("fast") if event["event"] == "progress" else None
        size = fast.get("bytes") if isinstance(fast, dict) else None
        if isinstance(size, (int, float)) and not isinstance(size, bool) and size > 0:
            out.append(int(size))
    return out


def measured(name: str, profile: str, files_of, history: int = jobs.EARLIER) -> tuple[int, str] | None:
    """The state a rank the newest earlier job of this name and profile measured (the largest ``fast.bytes`` in
    its timelines) and that job's id; None where none of the last ``history`` records did. ``files_of(record)``:
    the submitting backend's reader of a job's files, as for the lead time (hpc.cluster.lead_time_history). A job
    whose files cannot be read is passed over; a cluster that cannot be reached ends the search."""
    for record in jobs.iter_earlier(name, profile, history):
        try:
            files = files_of(record)
            sizes = [n for task in record.tasks[:TASKS_READ]
                     for n in _fast_bytes(timeline.read(record.job_dir, task, files))]
        except HpcError:  # the cluster cannot be reached now: the submit will say so itself
            return None
        if sizes:
            return max(sizes), record.job_id
    return None


def check(effective: Effective, state_bytes: int | None, files_of=None) -> dict | None:
    """What `hpc submit --json` carries as ``fast_tier``: the bytes per node the fast tier needs for ``state_bytes``
    a rank, against the node memory the job gets (``fits`` None where it is not known), and where the state size
    came from (``state_from``: "--state-size", or "job <id>" when ``state_bytes`` is None and ``files_of`` is given:
    what the newest earlier job of the same name and profile measured, ``measured``). None where there is nothing
    to check: no state size, or the fast tier off. A sharded model (FSDP) or DeepSpeed counts the node's every
    rank's shards or files. Says one warning line on stderr when it does not fit."""
    settings, job = effective.profile.fast_tier, effective.job
    if not settings.enabled:
        return None
    source, note = "--state-size", ""
    if state_bytes is None and files_of is not None:
        found = measured(job.job_name, effective.profile.name, files_of)
        if found is not None:
            state_bytes, source, note = found[0], f"job {found[1]}", f" (measured by job {found[1]})"
    if state_bytes is None:
        return None
    replicas = settings.replicas if job.nodes > 1 else 1  # one node has no next node to keep a copy on
    ranks = (job.nproc_per_node or 1) if job.strategy in PER_RANK else 1
    need = est.fast_tier_node_bytes(state_bytes * ranks, replicas)
    memory = node_memory(job)
    fit = {**est.fast_tier_fit(need, memory[0] if memory else None), "state_bytes": state_bytes,
           "state_from": source, "replicas": replicas}
    if fit["fits"] is False:
        per_node = f" x {ranks} ranks" if ranks > 1 else ""
        print(f"hpc: warning: the fast tier needs {_gib(need)} of node memory per node ({_gib(state_bytes)} of state "
              f"a rank{note}{per_node} x {replicas} replica(s) x {est.FAST_TIER_FOLDERS} folders) and the job gets "
              f"{memory[1]} ({_gib(memory[0])}) a node: its saves would fall back to the shared tier; fix: "
              f"{est.FAST_TIER_FIX}, or ask for more memory (--mem)", file=sys.stderr)
    return fit
