"""A ParallelismConfig's sizes as a job carries them (the PARALLELISM_CONFIG_* variables Accelerate's launcher
sets), checked against the job's shape before anything is queued. Torch-free: `hpc submit` reads it."""

from __future__ import annotations

from hpc.errors import HpcError

DIMS = ("dp_replicate", "dp_shard", "cp", "tp")


def sizes(env: dict) -> dict[str, int] | None:
    """The sizes a job's variables ask for, None when they ask for no ParallelismConfig."""
    named = {d: env.get(f"PARALLELISM_CONFIG_{d.upper()}_SIZE") for d in DIMS}
    if str(env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "")).lower() not in ("1", "true", "yes") and not any(
            v is not None for v in named.values()):
        return None
    out = {}
    for dim, raw in named.items():
        try:
            out[dim] = int(raw) if raw is not None else 1
        except ValueError:
            raise HpcError(f"PARALLELISM_CONFIG_{dim.upper()}_SIZE={raw!r} is not a whole number",
                           fix="set it to 1 or more") from None
        if out[dim] < 1:
            raise HpcError(f"PARALLELISM_CONFIG_{dim.upper()}_SIZE={raw} must be 1 or more", fix="use 1 or more")
    return out


def check(env: dict, nodes: int, per_node: int, elastic: str | None, min_nodes: int | None = None) -> None:
    """One line when the mesh cannot be laid over the job: sizes whose product is not its ranks, tensor and
    context parallelism (tp x cp, the innermost dimensions) that do not fit in one node's processes."""
    mesh = sizes(env)
    if mesh is None or all(v == 1 for v in mesh.values()):
        return
    shown = " x ".join(f"{d} {n}" for d, n in mesh.items() if n > 1)
    if elastic:
        raise HpcError(f"ParallelismConfig {shown} with elastic {elastic}: a mesh has a fixed number of ranks",
                       fix="drop --elastic, or the ParallelismConfig sizes")
    if min_nodes:
        raise HpcError(f"ParallelismConfig {shown} with min_nodes {min_nodes}: a mesh has a fixed number of ranks, "
                       "and a requeue may run the job on fewer nodes",
                       fix="drop --min-nodes, or the ParallelismConfig sizes")
    if (mesh["tp"] > 1 or mesh["cp"] > 1) and mesh["dp_replicate"] > 1 and mesh["dp_shard"] == 1:
        raise HpcError(f"ParallelismConfig {shown}: tensor/context parallelism cannot be composed with pure data "
                       "parallelism (dp_replicate > 1, dp_shard 1)", fix="set dp_shard_size > 1 (FSDP x TP/CP), or "
                       "dp_replicate and dp_shard both > 1 (HSDP x TP/CP)")
    world, total = nodes * per_node, mesh["dp_replicate"] * mesh["dp_shard"] * mesh["cp"] * mesh["tp"]
    if total != world:
        raise HpcError(f"ParallelismConfig {shown} needs {total} processes; the job has {world} ({nodes} node(s) x "
                       f"{per_node})", fix="make dp_replicate x dp_shard x cp x tp the job's processes")
    inner = mesh["tp"] * mesh["cp"]
    if per_node % inner:
        raise HpcError(f"ParallelismConfig {shown}: tp x cp = {inner} does not divide a node's {per_node} "
                       "processes (its collectives in every layer would cross nodes)",
                       fix=f"use a tp x cp that divides {per_node}, or {inner} processes per node")
