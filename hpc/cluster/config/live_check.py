"""A profile held against the live cluster (``hpc profile check``, ``hpc profile validate --live``): one line
per thing the cluster contradicts, so a wrong profile shows at once, not hours later in the queue."""

from __future__ import annotations

import re

from hpc.cluster.config.detect import limit_nodes, preemption
from hpc.slurm import formats
from hpc.slurm.cluster_facts import ClusterFacts


def differences(profile, facts: ClusterFacts) -> list[str]:
    """What in ``profile`` the live cluster contradicts, one line each (empty: it fits)."""
    p = facts.partition(profile.partition)
    if p is None:
        if profile.partition:
            return [f"partition {profile.partition} no longer exists (partitions: {', '.join(facts.partitions)})"]
        return ["the cluster has no default partition and the profile names none"]
    out = []
    if p.state != "UP":
        out.append(f"partition {p.name} is {p.state}")
    nodes = limit_nodes(p)
    if profile.max_nodes and nodes and profile.max_nodes > nodes[0]:
        out.append(f"max_nodes {profile.max_nodes} exceeds partition {p.name}'s {nodes[0]} ({nodes[1]})")
    if p.max_time_s is not None:
        for key in ("max_time", "default_time"):
            value = getattr(profile, key)
            asked = formats.parse_time(value) if value else None
            if value and (asked is None or asked > p.max_time_s):
                out.append(f"{key} {value} exceeds partition {p.name}'s MaxTime {p.max_time}")
    gpus, cpus = p.fewest("gpus"), p.fewest("cpus")
    if profile.gpus_per_node and gpus is not None and profile.gpus_per_node > gpus:
        out.append(f"gpus_per_node {profile.gpus_per_node}: the nodes of partition {p.name} have "
                   + (f"{gpus} (GRES gpu)" if gpus else "no GPUs (GRES)"))
    if profile.gpu_type and gpus:
        types = {n.gpu_type for n in p.nodes}
        if profile.gpu_type not in types:
            out.append(f"gpu_type {profile.gpu_type}: the GPUs of partition {p.name} are "
                       + ", ".join(sorted(t or "untyped" for t in types)))
    per_node = profile.gpus_per_node or profile.tasks_per_node or 1
    if profile.cpus_per_task and cpus and profile.cpus_per_task * per_node > cpus:
        out.append(f"cpus_per_task {profile.cpus_per_task} x {per_node} processes per node exceeds the "
                   f"{cpus} CPUs of partition {p.name}'s smallest node")
    if profile.constraint:
        known = set(p.all_features())
        missing = [f for f in _features(profile.constraint) if f not in known]
        if missing:
            out.append(f"constraint {profile.constraint}: no node of partition {p.name} has "
                       f"{', '.join(missing)}" + (f" (features: {', '.join(sorted(known))})" if known else ""))
    if profile.max_array_size and facts.max_array_size and profile.max_array_size > facts.max_array_size:
        out.append(f"max_array_size {profile.max_array_size} exceeds the cluster's MaxArraySize "
                   f"{facts.max_array_size}")
    a = facts.access
    if a is not None:
        if profile.account and a.accounts and profile.account not in a.accounts:
            out.append(f"account {profile.account} is not one {a.user} may use on {p.name} "
                       f"({', '.join(a.accounts)})")
        if profile.qos and a.qos and profile.qos not in a.qos:
            out.append(f"qos {profile.qos} is not one {a.user} may use on {p.name} ({', '.join(a.qos)})")
    mode, grace, said = preemption(facts, p, profile.qos)
    if grace and not mode.upper().startswith("OFF") and profile.preemption.lead_time > grace:
        out.append(f"preemption.lead_time {profile.preemption.lead_time} s is longer than {said.split(':')[0]}'s "
                   f"GraceTime {grace} s: a save that needs the lead time is cut off when the job is preempted")
    return out


def _features(constraint: str) -> list[str]:
    """The feature names in a constraint expression (``a&(b|c)*2``, ``[rack1*2&rack2*4]``)."""
    return [f for f in re.split(r"[&|,()\[\]!]+", re.sub(r"\*\d+", "", constraint)) if f]
