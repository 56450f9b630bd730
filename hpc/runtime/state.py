"""This process's place in the job: rank, world, device, process group."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from hpc import env as hpc_env


@dataclass
class ProcessState:
    env: hpc_env.DistEnv
    device: torch.device
    backend: str | None

    @property
    def distributed(self) -> bool:
        return self.env.world_size > 1

    @classmethod
    def start(cls, cpu: bool = False, need_group: bool = False) -> "ProcessState":
        """``need_group``: form a process group even for one process (FSDP and DeepSpeed need one)."""
        env = hpc_env.detect()
        hpc_env.export(env)
        use_cuda = torch.cuda.is_available() and not cpu
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count()) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)
        backend = None
        if env.world_size > 1 or need_group:
            backend = "nccl" if use_cuda else "gloo"
            if not dist.is_initialized():
                dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                                        device_id=device if use_cuda else None)
        return cls(env, device, backend)
