"""How this process was started, and its place in the job: torch-free, so launchers and the CLI can use it.

Detects, in order: standard variables already set by a launcher (torchrun, elastic included; the DeepSpeed
launcher; hpc's own job templates), a submitit task, an srun task, and a plain process (world of one).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, MutableMapping

from hpc.contract.rendezvous import port_for
from hpc.errors import HpcError
from hpc.slurm import hostlist

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class DistEnv:
    launcher: str  # torchrun | env | submitit | srun | single
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    job_id: str | None = None
    restart_count: int = 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def variables(self) -> dict[str, str]:
        return {"RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank), "WORLD_SIZE": str(self.world_size),
                "LOCAL_WORLD_SIZE": str(self.local_world_size), "NODE_RANK": str(self.node_rank),
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}


# what export() sets: a process's place in its job, which SLURM's own numbers decide in its tasks, and its rendezvous
PLACE_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK")
STANDARD_VARIABLES = (*PLACE_VARIABLES, "MASTER_ADDR", "MASTER_PORT")


def _int(environ: Mapping[str, str], key: str, default: int | None = None) -> int:
    value = environ.get(key)
    if value is None or value == "":
        if default is None:
            raise HpcError(f"{key} is not set", fix="start the process with srun, torchrun or `hpc launch`")
        return default
    try:
        return int(value)
    except ValueError:
        raise HpcError(f"{key}={value!r} is not a number", fix=f"unset {key} or give a whole number") from None


def tasks_on_node(tasks_per_node: str, node: int) -> int:
    """SLURM_TASKS_PER_NODE ('2(x3),1') -> the task count of node ``node``."""
    counts: list[int] = []
    for item in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            raise HpcError(f"SLURM_TASKS_PER_NODE={tasks_per_node!r} cannot be read", fix="report this with `hpc env`")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if node < len(counts) else counts[-1]


def _from_slurm(environ: Mapping[str, str]) -> DistEnv:
    job_id = environ.get("SLURM_JOB_ID", "")
    nodes = hostlist.expand(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", ""))
    node = _int(environ, "SLURM_NODEID", 0)
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or "1"
    return DistEnv(
        launcher="srun", rank=_int(environ, "SLURM_PROCID"), local_rank=_int(environ, "SLURM_LOCALID", 0),
        world_size=_int(environ, "SLURM_STEP_NUM_TASKS", 0) or _int(environ, "SLURM_NTASKS", 1),
        local_world_size=tasks_on_node(per_node, node), node_rank=node,
        num_nodes=len(nodes) or _int(environ, "SLURM_NNODES", 1),
        master_addr=environ.get("MASTER_ADDR") or (nodes[0] if nodes else ""),
        master_port=_int(environ, "MASTER_PORT", port_for(job_id)), job_id=job_id,
        restart_count=_int(environ, "SLURM_RESTART_COUNT", 0))


def _from_submitit(environ: Mapping[str, str]) -> DistEnv:
    if environ.get("SUBMITIT_EXECUTOR") == "slurm":
        return _from_slurm(environ)
    job_id = environ.get("SUBMITIT_LOCAL_JOB_ID", "")
    world = _int(environ, "SUBMITIT_LOCAL_NTASKS", 1)
    return DistEnv(launcher="submitit", rank=_int(environ, "SUBMITIT_LOCAL_GLOBALID", 0),
                   local_rank=_int(environ, "SUBMITIT_LOCAL_LOCALID", 0), world_size=world, local_world_size=world,
                   node_rank=0, num_nodes=1, master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
                   master_port=_int(environ, "MASTER_PORT", port_for(job_id)), job_id=job_id)


def _from_standard(environ: Mapping[str, str]) -> DistEnv:
    world = _int(environ, "WORLD_SIZE")
    local_world = _int(environ, "LOCAL_WORLD_SIZE", 0) or world
    rank = _int(environ, "RANK")
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in environ else "env"
    return DistEnv(
        launcher=launcher, rank=rank, local_rank=_int(environ, "LOCAL_RANK", rank % local_world),
        world_size=world, local_world_size=local_world,
        node_rank=_int(environ, "GROUP_RANK", _int(environ, "NODE_RANK", rank // local_world)),
        num_nodes=max(1, world // local_world), master_addr=environ.get("MASTER_ADDR", ""),
        master_port=_int(environ, "MASTER_PORT", 0),
        job_id=environ.get("SLURM_JOB_ID") or environ.get("TORCHELASTIC_RUN_ID"),
        restart_count=_int(environ, "TORCHELASTIC_RESTART_COUNT", _int(environ, "SLURM_RESTART_COUNT", 0)))


def detect(environ: Mapping[str, str] | None = None) -> DistEnv:
    environ = os.environ if environ is None else environ
    if "RANK" in environ and "WORLD_SIZE" in environ:
        env = _from_standard(environ)
    elif "SUBMITIT_EXECUTOR" in environ:
        env = _from_submitit(environ)
    elif "SLURM_PROCID" in environ and "SLURM_STEP_ID" in environ:
        env = _from_slurm(environ)
    else:
        env = DistEnv(launcher="single", rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                      num_nodes=1, master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
                      master_port=_int(environ, "MASTER_PORT", port_for(os.getpid())))
    validate(env)
    return env


def validate(env: DistEnv) -> None:
    if not 0 <= env.rank < env.world_size:
        raise HpcError(f"RANK {env.rank} is outside WORLD_SIZE {env.world_size}", fix="check the launcher's settings")
    if env.is_distributed and not env.master_addr:
        raise HpcError("no MASTER_ADDR for a distributed job", fix="start it with srun, torchrun or `hpc launch`")
    if env.is_distributed and not env.master_port:
        raise HpcError("no MASTER_PORT for a distributed job", fix="set MASTER_PORT or start it with `hpc launch`")
    if env.num_nodes > 1 and env.master_addr in LOOPBACK and env.launcher != "torchrun":
        # each node would form a world of its own on its own loopback and wait forever (torchrun's agents
        # agreed on this address through their rendezvous: it names the store's host as that host calls itself)
        raise HpcError(f"a {env.num_nodes}-node job would rendezvous on {env.master_addr}",
                       fix="let MASTER_ADDR be the first host of the allocation (unset it; hpc derives it)")


def export(env: DistEnv, environ: MutableMapping[str, str] | None = None) -> None:
    """Set the standard variables that are missing; ones already set win, except a process's place in an srun
    task: there a NODE_RANK or LOCAL_WORLD_SIZE without RANK came from the submitting shell (sbatch exports all
    of it to every task), and kept, it would give every node the same NODE_RANK."""
    environ = os.environ if environ is None else environ
    for key, value in env.variables().items():
        if env.launcher == "srun" and key in PLACE_VARIABLES:
            environ[key] = value
        else:
            environ.setdefault(key, value)
