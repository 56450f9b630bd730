"""Every rank reports where it runs, then all ranks meet and sum their ranks with one all_reduce.

Runs anywhere hpc starts ranks: `hpc submit --profile local --nproc 2`, srun, torchrun.
"""

import os
import socket

import torch
import torch.distributed as dist


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    expected = world * (world - 1) / 2
    print(f"rank={rank} world_size={world} local_rank={os.environ.get('LOCAL_RANK')} host={socket.gethostname()} "
          f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} all_reduce={total.item():g} "
          f"{'ok' if total.item() == expected else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    if total.item() != expected:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
