"""`python -m hpc.runtime.sanity`: what each rank of an `hpc test` job runs.

A few small checks through hpc's Accelerator and torch.distributed (gloo on CPU, NCCL on GPU, as the
Accelerator chooses). Each rank writes what it saw to ``$HPC_JOB_DIR/sanity/`` after every check, so a rank
that dies or hangs still tells how far it got; `hpc test` compares the ranks' files. Exit 1 if a check failed.

The check names are hpc.contract.sanity_checks': `hpc test` reads them on the login node.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import time
from pathlib import Path

from hpc.contract import launch_env as hpc_env
from hpc.contract import layout
from hpc.contract.atomic import atomic_write
from hpc.contract.sanity_checks import ALL_GATHER, ALL_REDUCE, BARRIER, BROADCAST, PROCESS_GROUP, TRAINING
from hpc.errors import HpcError

LR = 0.1
# the last rank reaches the barrier this late: a barrier that lets the others through early shows as a short wait
BARRIER_DELAY_S = 0.5


def _run(env: hpc_env.DistEnv, note) -> None:
    import torch
    import torch.distributed as dist

    from hpc.runtime import Accelerator

    acc = Accelerator(mixed_precision="no")  # exact arithmetic: the training check recomputes the step by hand
    rank, world, dev = acc.process_index, acc.num_processes, acc.device
    joined = world == 1 or (dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) == (rank, world))
    note(PROCESS_GROUP, joined, f"{acc.state.backend or 'none needed (one process)'} on {dev}")

    total = acc.reduce(torch.tensor([rank + 1.0], device=dev), "sum").item()
    expected = world * (world + 1) / 2
    note(ALL_REDUCE, total == expected, f"sum of rank+1 = {total:g} (expected {expected:g})")

    # a fresh number each run: a stale or default value cannot pass for rank 0's
    token = random.SystemRandom().randrange(1, 2**31) if rank == 0 else -1
    value = torch.tensor([token], dtype=torch.int64, device=dev)
    if world > 1:
        dist.broadcast(value, src=0)
    got = int(value.item())
    note(BROADCAST, got != -1 and (rank != 0 or got == token), f"got {got}", got)

    order = acc.gather(torch.tensor([rank], device=dev)).tolist()
    note(ALL_GATHER, order == list(range(world)), f"gathered ranks {order}")

    weights = _training_step(acc, torch)
    expected_w = _expected_weights(world, torch)
    diff = (weights - expected_w).abs().max().item()
    note(TRAINING, diff <= 1e-5, f"weights {'match' if diff <= 1e-5 else 'differ from'} the averaged-gradient "
         f"step (max diff {diff:.1e})", [round(w, 6) for w in weights.tolist()])

    if rank == world - 1:
        time.sleep(BARRIER_DELAY_S)
    start = time.monotonic()
    acc.wait_for_everyone()
    waited = time.monotonic() - start
    late = rank == world - 1 and world > 1
    note(BARRIER, world == 1 or late or waited >= BARRIER_DELAY_S / 2,
         f"came {BARRIER_DELAY_S} s late on purpose" if late else
         f"waited {waited:.2f} s for the last rank, which came {BARRIER_DELAY_S} s late")
    if dist.is_initialized():
        dist.destroy_process_group()


def _data(rank: int, torch):
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(8, 4, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def _training_step(acc, torch):
    """One step of a tiny model. Ranks start from different weights and see different data, so equal weights
    afterwards take both prepare() (rank 0's weights everywhere) and backward() (averaged gradients)."""
    torch.manual_seed(100 + acc.process_index)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt = acc.prepare(model, opt)
    x, y = _data(acc.process_index, torch)
    loss = torch.nn.functional.mse_loss(model(x.to(acc.device)), y.to(acc.device))
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    return _flat(acc.unwrap_model(model), torch)


def _expected_weights(world: int, torch):
    """The same step done here by hand: rank 0's start, the mean of every rank's gradient."""
    torch.manual_seed(100)
    model = torch.nn.Linear(4, 1)
    for r in range(world):
        x, y = _data(r, torch)
        (torch.nn.functional.mse_loss(model(x), y) / world).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad
    return _flat(model, torch)


def _flat(model, torch):
    return torch.cat([p.detach().float().cpu().reshape(-1) for p in model.parameters()])


def _save(path: Path | None, result: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(result))  # `hpc test` may read while a hung job is cancelled: never half a file


def main() -> int:
    try:
        env = hpc_env.detect()
    except HpcError as e:
        print(f"hpc.runtime.sanity: error: {e}", file=sys.stderr)
        return 2
    host, job_dir = socket.gethostname(), os.environ.get("HPC_JOB_DIR")
    path = Path(job_dir, layout.SANITY, layout.sanity_result(env.rank, host, os.getpid())) if job_dir else None
    result = {"rank": env.rank, "world": env.world_size, "local_rank": env.local_rank, "host": host,
              "launcher": env.launcher, "checks": {}, "error": None}
    _save(path, result)  # before torch loads: even a rank that dies importing it is counted

    def note(name: str, ok: bool, detail: str, value=None) -> None:
        result["checks"][name] = {"ok": bool(ok), "detail": detail, "value": value}
        _save(path, result)
        print(f"[rank {env.rank}] {'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)

    try:
        _run(env, note)
    except Exception as e:  # noqa: BLE001 - any failure is a finding to report, not a crash of the test
        result["error"] = f"{type(e).__name__}: {' '.join(str(e).split())}"[:500]
        _save(path, result)
        print(f"[rank {env.rank}] FAIL {result['error']}", flush=True)
    failed = result["error"] or not all(c["ok"] for c in result["checks"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
