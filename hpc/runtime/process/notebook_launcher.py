"""`notebook_launcher` and `debug_launcher`: a training function run by several processes of this machine.

Accelerate's two in-process launchers. The processes are forked, so a function defined in a notebook cell or a
test works without being importable; each gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and an
Accelerator (or PartialState) built inside forms the process group from them. Fork must come before CUDA is
initialised in this process (as in Accelerate): build models and Accelerators inside the function.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from hpc.errors import HpcError


def _one_process(index: int, function: Callable, args: tuple, env: dict[str, str], base_rank: int) -> None:
    os.environ.update(env)
    os.environ.update({"RANK": str(base_rank + index), "LOCAL_RANK": str(index)})
    function(*args)


def _start(function: Callable, args: tuple, nprocs: int, env: dict[str, str], base_rank: int = 0) -> None:
    import torch
    import torch.multiprocessing as mp

    if torch.cuda.is_initialized():
        raise HpcError("CUDA was initialised in this process before the launcher forked",
                       fix="build models, tensors on the GPU and the Accelerator inside the launched function")
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    try:
        mp.start_processes(_one_process, args=(function, tuple(args), env, base_rank), nprocs=nprocs,
                           start_method="fork")
    except mp.ProcessRaisedException as e:  # the first line names the rank and the error
        raise HpcError(f"a launched process failed: {str(e).strip().splitlines()[-1]}",
                       fix="see the traceback above") from e
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def notebook_launcher(function: Callable, args: tuple = (), num_processes: int | None = None,
                      mixed_precision: str = "no", use_port: str | int = "29500", master_addr: str = "127.0.0.1",
                      node_rank: int = 0, num_nodes: int = 1, **torchrun_settings: Any) -> None:
    """Run ``function(*args)`` in ``num_processes`` processes of this machine (one process: here, directly).
    With ``num_nodes`` > 1, every machine runs this with its ``node_rank`` and the first one's address."""
    unknown = sorted(set(torchrun_settings) - {"rdzv_backend", "rdzv_endpoint", "rdzv_conf", "rdzv_id",
                                                "max_restarts", "monitor_interval", "log_line_prefix_template"})
    if unknown:
        raise HpcError(f"notebook_launcher({unknown[0]}=...) is not a launcher setting", fix="drop it")
    defaults = {"rdzv_backend": "static", "rdzv_endpoint": "", "rdzv_conf": None, "rdzv_id": "none",
                "max_restarts": 0, "monitor_interval": 0.1, "log_line_prefix_template": None}
    changed = sorted(k for k, v in torchrun_settings.items() if v != defaults[k])
    if changed:
        raise HpcError(f"notebook_launcher({changed[0]}=...) is not supported by hpc (its processes are forked "
                       "here, without torchrun's agent)",
                       fix="drop it; for restarts submit the training as a job (hpc submit): "
                           "it is requeued and resumes")
    env = {"ACCELERATE_MIXED_PRECISION": str(mixed_precision)}
    if not num_processes or (num_processes == 1 and num_nodes == 1):
        os.environ.update(env)
        function(*args)
        return
    world = num_processes * num_nodes
    env.update({"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(num_processes), "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(use_port), "NODE_RANK": str(node_rank)})
    _start(function, args, num_processes, env, base_rank=node_rank * num_processes)


def debug_launcher(function: Callable, args: tuple = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` in ``num_processes`` CPU processes: a distributed test without GPUs."""
    import socket

    with socket.socket() as s:  # a free port: several debug launches may run at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"WORLD_SIZE": str(num_processes), "LOCAL_WORLD_SIZE": str(num_processes), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "ACCELERATE_USE_CPU": "true"}
    _start(function, args, num_processes, env)


def test_launch() -> None:
    """Checks that a PartialState can be built in this process (Accelerate's smoke test of a launch)."""
    from hpc.runtime.process.state import PartialState

    PartialState()
