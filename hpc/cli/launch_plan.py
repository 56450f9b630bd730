"""What `hpc launch` makes of Accelerate's settings: the variables to export, torchrun's command line, and the
check of the user's machine rank, main IP and process counts against what SLURM says."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

from hpc.cluster.config import accelerate_file
from hpc.contract import accelerate_settings
from hpc.errors import HpcError, shown

ACCELERATE_DEFAULT_PORT = 29500  # what `accelerate launch` uses when no --main_process_port is given


@dataclass
class Request:
    values: dict[str, Any] = field(default_factory=dict)  # hpc keys
    environ: dict[str, str] = field(default_factory=dict)  # exported for the processes
    notes: list[str] = field(default_factory=list)
    expected: dict[str, Any] = field(default_factory=dict)
    torchrun_flags: list[str] = field(default_factory=list)
    rdzv_backend: str = "static"


def read_settings(flags: dict[str, Any]) -> Request:
    """The config file (--config_file, else Accelerate's default file), then the flags over it."""
    flags = dict(flags)
    config_file = flags.pop("config_file", None)
    path = config_file or accelerate_file.default_path()
    raw = accelerate_file.read(path) if path else {}
    parts = [accelerate_file.translate(path, default_file=not config_file, settings=raw)] if path else []
    parts.append(accelerate_settings.translate(flags, "command line", spell=lambda s: f"--{s}"))
    request = Request()
    for part in parts:
        request.values.update(part.values)
        request.notes += part.notes
        request.expected.update(part.expected)
    request.environ = accelerate_settings.to_environ(request.values)
    request.environ.update(request.values.get("env") or {})
    if request.values.get("cpu_threads_per_process"):
        request.environ["OMP_NUM_THREADS"] = str(request.values["cpu_threads_per_process"])
    if request.values.get("gpu_ids"):
        request.environ["CUDA_VISIBLE_DEVICES"] = request.values["gpu_ids"]
    if request.values.get("monitor_interval") is not None:
        request.torchrun_flags.append(f"--monitor_interval={request.values['monitor_interval']}")
    request.rdzv_backend = str(flags.get("rdzv_backend") or raw.get("rdzv_backend") or "static").lower()
    return request


def is_main_launcher(environ=None) -> bool:
    """Only one copy of the launcher speaks (srun starts one per task)."""
    environ = os.environ if environ is None else environ
    return environ.get("SLURM_PROCID", "0") == "0" and environ.get("RANK", "0") == "0"


def one_task_per_node(environ) -> bool:
    tasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS")
    nodes = environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES")
    return tasks is not None and tasks == nodes


def _same_host(a: str, b: str) -> bool:
    if a == b or a.split(".")[0] == b.split(".")[0]:
        return True
    try:
        return socket.gethostbyname(a) == socket.gethostbyname(b)
    except OSError:
        return False


def check_against_slurm(expected: dict[str, Any], node, nproc_per_agent: int | None) -> None:
    """Accelerate's SLURM scripts pass what SLURM already knows; a value that disagrees would split the job
    into groups that never meet, so it is an error rather than a guess."""
    world = node.num_nodes * nproc_per_agent if nproc_per_agent else node.world_size
    checks = [("machine_rank", node.node_rank, "SLURM_NODEID"), ("num_machines", node.num_nodes, "SLURM_NNODES"),
              ("num_processes", world, "the step's tasks x processes per node")]
    for name, actual, source in checks:
        if name in expected and expected[name] != actual:
            raise HpcError(f"{name} {shown(expected[name])} (a flag or the config file), but SLURM says {actual} "
                           f"({source})",
                           fix=f"drop {name}: in a SLURM job hpc takes it from SLURM")
    ip = expected.get("main_process_ip")
    if ip and node.master_addr and not _same_host(str(ip), node.master_addr):
        raise HpcError(f"main_process_ip {shown(str(ip))} (a flag or the config file) is not the job's first node "
                       f"{node.master_addr}", fix="drop main_process_ip: in a SLURM job hpc takes the first node")


def torchrun_target(as_module: bool, no_python: bool, target: str, args) -> list[str]:
    if as_module:
        return ["--module", target, *args]
    if no_python or not target.endswith(".py"):
        return ["--no-python", target, *args]
    return [target, *args]


def torchrun_argv(*, nnodes, nproc, endpoint, run_id, max_restarts, extra, target) -> list[str]:
    """One agent per node: it starts this node's processes; c10d rendezvous at ``endpoint``."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}",
            f"--max_restarts={max_restarts}", *extra, *target]


def machines_argv(request: Request, machines: int, nproc: int, max_restarts: int, target: list[str]) -> list[str]:
    """This machine's share of a job spread over machines by hand, as `accelerate launch` starts it."""
    rank, ip = request.expected.get("machine_rank"), request.expected.get("main_process_ip")
    if ip is None or (rank is None and request.rdzv_backend != "c10d"):
        raise HpcError(f"--num_machines {machines} outside SLURM needs --machine_rank and --main_process_ip on "
                       "each machine", fix="give both (or submit with hpc submit, where SLURM knows them)")
    port = request.values.get("main_process_port") or ACCELERATE_DEFAULT_PORT
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={machines}", f"--nproc_per_node={nproc}",
            f"--max_restarts={max_restarts}", *request.torchrun_flags]
    if request.rdzv_backend == "c10d":
        argv += ["--rdzv_backend=c10d", f"--rdzv_endpoint={ip}:{port}", "--rdzv_id=hpc"]
    else:
        argv += [f"--node_rank={rank}", f"--master_addr={ip}", f"--master_port={port}"]
    return [*argv, *target]
