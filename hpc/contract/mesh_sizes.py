"""The mesh's rules, once, torch-free: its dimensions and their order, the variables that carry their sizes, the
joint dimensions, and which sizes compose. Read at submit (`hpc submit` checks a job's PARALLELISM_CONFIG_*
against its nodes and processes before anything is queued), by Accelerate's launch settings
(contract/accelerate_settings.py), and in the job by ParallelismConfig (runtime/parallel/mesh.py)."""

from __future__ import annotations

from hpc.errors import HpcError

# the mesh's order, outermost first: tp, the innermost, falls within a node (consecutive ranks share one), where
# tensor parallelism's all-reduces in every layer find the fastest links
DIMS = ("dp_replicate", "dp_shard", "cp", "tp")
NON_DATA = ("tp", "cp")  # the dimensions whose ranks take the same batches (Accelerate's non_dp_dim_names order)
# Accelerate's flattened dimensions, each the dimensions it joins (those > 1 of them): the data-parallel ranks
# (distinct batches), what FSDP shards over, what a loss is averaged over
JOINT = {"dp": ("dp_replicate", "dp_shard"), "dp_shard_cp": ("dp_shard", "cp"),
         "dp_cp": ("dp_replicate", "dp_shard", "cp")}


def variable(dim: str) -> str:
    """The variable Accelerate's launcher sets for a dimension's size."""
    return f"PARALLELISM_CONFIG_{dim.upper()}_SIZE"


def parse(dim: str, raw: str) -> int:
    """A size as its variable carries it; the check that it is 1 or more is the reader's (its message names how
    the size was given)."""
    try:
        return int(raw)
    except ValueError:
        raise HpcError(f"{variable(dim)}={raw!r} is not a whole number", fix="set it to 1 or more") from None


def total(mesh: dict[str, int]) -> int:
    """The processes a mesh takes: the product of its sizes."""
    return mesh["dp_replicate"] * mesh["dp_shard"] * mesh["cp"] * mesh["tp"]


def tp_cp_over_pure_replicate(mesh: dict[str, int]) -> bool:
    """Tensor or context parallelism asked over pure data parallelism (dp_replicate > 1, dp_shard 1): refused, as
    Accelerate's: their DTensors compose with FSDP2's sharding (dp_shard > 1, HSDP with both), not with DDP."""
    return (mesh["tp"] > 1 or mesh["cp"] > 1) and mesh["dp_replicate"] > 1 and mesh["dp_shard"] == 1


def sizes(env: dict) -> dict[str, int] | None:
    """The sizes a job's variables ask for, None when they ask for no ParallelismConfig."""
    named = {d: env.get(variable(d)) for d in DIMS}
    if str(env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "")).lower() not in ("1", "true", "yes") and not any(
            v is not None for v in named.values()):
        return None
    out = {}
    for dim, raw in named.items():
        out[dim] = parse(dim, raw) if raw is not None else 1
        if out[dim] < 1:
            raise HpcError(f"{variable(dim)}={raw} must be 1 or more", fix="use 1 or more")
    return out


def check(env: dict, nodes: int, per_node: int, elastic: str | None, min_nodes: int | None = None) -> None:
    """One line when the mesh cannot be laid over the job: sizes whose product is not its ranks, tensor and
    context parallelism (tp x cp, the innermost dimensions) that do not fit in one node's processes; a Megatron-LM
    layout (tp x pp x dp) likewise."""
    megatron_check(env, nodes, per_node, elastic)
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
    if tp_cp_over_pure_replicate(mesh):
        raise HpcError(f"ParallelismConfig {shown}: tensor/context parallelism cannot be composed with pure data "
                       "parallelism (dp_replicate > 1, dp_shard 1)", fix="set dp_shard_size > 1 (FSDP x TP/CP), or "
                       "dp_replicate and dp_shard both > 1 (HSDP x TP/CP)")
    world, needed = nodes * per_node, total(mesh)
    if needed != world:
        raise HpcError(f"ParallelismConfig {shown} needs {needed} processes; the job has {world} ({nodes} node(s) x "
                       f"{per_node})", fix="make dp_replicate x dp_shard x cp x tp the job's processes")
    inner = mesh["tp"] * mesh["cp"]
    if per_node % inner:
        raise HpcError(f"ParallelismConfig {shown}: tp x cp = {inner} does not divide a node's {per_node} "
                       "processes (its collectives in every layer would cross nodes)",
                       fix=f"use a tp x cp that divides {per_node}, or {inner} processes per node")


def _megatron_size(env: dict, name: str) -> int:
    raw = env.get(f"MEGATRON_LM_{name}", "1")
    try:
        return int(raw) if raw not in ("", "None") else 1
    except ValueError:
        raise HpcError(f"MEGATRON_LM_{name}={raw!r} is not a whole number", fix="set it to 1 or more") from None


def megatron_check(env: dict, nodes: int, per_node: int, elastic: str | None) -> None:
    """distributed_type MEGATRON_LM: tp_degree x pp_degree must divide the job's processes (the data-parallel
    ranks are what is left), tp_degree a node's (its all-reduces in every layer stay within a node)."""
    if str(env.get("ACCELERATE_USE_MEGATRON_LM", "")).lower() not in ("1", "true", "yes"):
        return
    tp, pp = _megatron_size(env, "TP_DEGREE"), _megatron_size(env, "PP_DEGREE")
    world = nodes * per_node
    if elastic and tp * pp > 1:
        raise HpcError(f"Megatron-LM tp {tp} x pp {pp} with elastic {elastic}: its layout has a fixed number of "
                       "ranks", fix="drop --elastic")
    if world % (tp * pp):
        raise HpcError(f"Megatron-LM tp_degree {tp} x pp_degree {pp} does not divide the job's {world} processes "
                       f"({nodes} node(s) x {per_node})", fix="make the processes a multiple of tp x pp (the data-"
                       "parallel ranks are the rest)")
    if per_node % tp:
        raise HpcError(f"Megatron-LM tp_degree {tp} does not divide a node's {per_node} processes (its "
                       "collectives in every layer would cross nodes)", fix=f"use a tp_degree that divides {per_node}")
