#!/usr/bin/env python3
"""Per-step cost of hpc's Accelerator against the same loop hand-written with torch DDP, on 2 ranks.

    python scripts/bench/step_overhead.py [--steps 200] [--rounds 7]

Both loops run in the same two processes, alternating round by round (so machine noise hits both):
MLP 256-512-512-1, batch 16 per rank, AdamW, gloo. Prints the median step time of each and the median of
the per-round ratios (target: at most 1.03). Accelerate is measured too when it is installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                               torch.nn.ReLU(), torch.nn.Linear(512, 1))


def batches(n):
    import torch

    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 256, generator=g), torch.randn(16, 1, generator=g)) for _ in range(n)]


def hand_written(data):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    net = DistributedDataParallel(model())
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return (time.perf_counter() - t0) / len(data)


def accelerated(acc, data):
    """The same loop through any Accelerate-style accelerator (hpc's or Accelerate's)."""
    import torch

    net = model()
    net, opt = acc.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-3))
    t0 = time.perf_counter()
    for x, y in data:
        opt.zero_grad()
        acc.backward(torch.nn.functional.mse_loss(net(x), y))
        opt.step()
    return (time.perf_counter() - t0) / len(data)


def with_hpc(data):
    from hpc import Accelerator

    return accelerated(Accelerator(), data)


def with_accelerate(data):
    from accelerate import Accelerator

    return accelerated(Accelerator(cpu=True), data)


def worker(steps: int, rounds: int) -> None:
    import importlib.util

    import torch.distributed as dist

    dist.init_process_group("gloo")
    loops = {"torch DDP (hand-written)": hand_written, "hpc Accelerator": with_hpc}
    if importlib.util.find_spec("accelerate"):
        loops["HF Accelerate"] = with_accelerate
    data = batches(steps)
    for fn in loops.values():  # warm-up
        fn(data[:20])
    times = {name: [] for name in loops}
    for r in range(rounds):
        for name, fn in loops.items():
            dist.barrier()
            times[name].append(fn(data))
        if dist.get_rank() == 0:
            print(f"\rround {r + 1}/{rounds}", end="", file=sys.stderr, flush=True)
    if dist.get_rank() == 0:
        print("\r", end="", file=sys.stderr)
        base = times["torch DDP (hand-written)"]
        print(f"{'loop':26}  median_ms/step  ratio_vs_ddp (median of rounds)")
        for name, ts in times.items():
            ratio = statistics.median(t / b for t, b in zip(ts, base))
            print(f"{name:26}  {1000 * statistics.median(ts):14.3f}  {ratio:6.3f}")
        print(f"(2 ranks, gloo, {steps} steps x {rounds} alternating rounds; target: hpc at most 1.03)")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.worker:
        worker(opts.steps, opts.rounds)
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    sys.exit(subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", __file__, "--worker",
                             "--steps", str(opts.steps), "--rounds", str(opts.rounds)], env=env).returncode)


if __name__ == "__main__":
    main()
