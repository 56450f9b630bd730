"""This process's place in the job: rank, world, device, process group. The one holder of these facts: the
Accelerator, PartialState and the checkpointer read them here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hpc.contract import launch_env as hpc_env
from hpc.errors import HpcError


@dataclass
class ProcessState:
    env: hpc_env.DistEnv
    device: torch.device
    backend: str | None

    @property
    def distributed(self) -> bool:
        return self.env.world_size > 1

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main_process(self) -> bool:
        return self.env.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.env.local_rank == 0

    # what the script's `accelerator.is_main_process` answers: under Megatron-LM's layout the last rank, where the
    # pipeline's loss is (as Accelerate's); hpc's own bookkeeping keeps rank 0 (is_main_process)
    main_is_last = False

    @property
    def script_main_process(self) -> bool:
        return self.env.rank == self.env.world_size - 1 if self.main_is_last else self.env.rank == 0

    @property
    def script_local_main_process(self) -> bool:
        if self.main_is_last:
            return self.env.local_rank == self.env.local_world_size - 1
        return self.env.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        return self.env.rank == self.env.world_size - 1

    # plain collectives of hpc's own bookkeeping (no stop vote, no hang beat: callers inside a save or a stop)
    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def broadcast_object(self, value):
        """Rank 0's picklable ``value`` on every rank."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_flag(self, value: bool) -> bool:
        """Rank 0's ``value`` on every rank, as a one-element tensor where the backend can send it (NCCL: GPU)."""
        if not self.distributed:
            return value
        flag = torch.tensor([int(value)], device=self.device if self.backend == "nccl" else "cpu")
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def leave_group(self) -> None:
        """The end of the run: the ranks tear their connections down together (a gloo rank whose peer closes
        while it is still finishing its last collective can abort at exit)."""
        if self.distributed and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    @classmethod
    def start(cls, cpu: bool = False, need_group: bool = False, backend: str | None = None,
              timeout=None) -> "ProcessState":
        """``need_group``: form a process group even for one process (FSDP and DeepSpeed need one).
        ``backend``/``timeout``: InitProcessGroupKwargs' (None: nccl with GPUs, gloo without; torch's timeout)."""
        env = hpc_env.detect()
        hpc_env.export(env)
        use_cuda = torch.cuda.is_available() and not cpu
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count()) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)
        wanted, backend = backend, None
        if env.world_size > 1 or need_group:
            backend = "nccl" if use_cuda else "gloo"
            if wanted not in (None, backend) and not (wanted == "gloo" and use_cuda):
                raise HpcError(f"InitProcessGroupKwargs(backend={wanted!r}) on {device.type}",
                               fix="drop backend: hpc picks nccl with GPUs and gloo without")
            backend = wanted or backend
            if not dist.is_initialized():
                extra = {"timeout": timeout} if timeout is not None else {}
                dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                                        device_id=device if backend == "nccl" else None, **_restart_store(env), **extra)
        return cls(env, device, backend)


def _restart_store(env) -> dict:
    """With the agents' shared store (a torchrun not started by hpc: hpc's launches set
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), the process group's keys carry no round and a restarted group
    would read the dead group's addresses. A prefix per restart count keeps rounds apart when every agent
    restarted for a failure; an agent that restarted only because another node rejoined counts differently,
    which is why hpc's own launches avoid the shared store altogether."""
    if env.launcher != "torchrun" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=False,
                          timeout=timedelta(minutes=10))
    return {"store": dist.PrefixStore(f"hpc/restart-{env.restart_count}", store)}
