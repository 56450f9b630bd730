#!/usr/bin/env python3
"""What a fast-tier save costs the training loop, and how fast its background half writes and replicates.

    python scripts/bench/fast_tier_save.py [--sizes 3M 1G] [--saves 4] [--dir /dev/shm] [--step 1.0] [--ranks 2]

Two processes on this machine stand for two nodes (gloo, LOCAL_WORLD_SIZE 1): each holds a model of the given
size, saves it to the fast tier (hpc.runtime.checkpoint.tiers.fast_tier) as the run guard does, and sends it to the
other. ``--ranks 1``: one process, no copy (the stall and the write alone: a 1 GiB state on two ranks of one small
machine needs ~10 GiB of memory between the states, buffers, and the tier's kept and received folders).
Per size, the median over the saves after the first (which allocates the staging buffers):
  stall      seconds the save held the loop (the copy of the state into host buffers; on a GPU, into pinned ones)
  % of step  stall against a step of --step seconds (the issue's bound: 2 %)
  write      the background write + checksum + commit into the tier, GB/s (replicas 1)
  replicate  write + the copy sent to the peer and committed there, GB/s of the rank's state (replicas 2)
``--overlap F``: the profile's fast_tier.overlap_copy; after each save the loop's forward and backward stand as a
wait of F x --step seconds (a GPU's compute leaves the CPU free), then the optimizer's step, whose pre-hook waits
for the copy: the stall is the save's return plus that wait.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpc.contract.launch_settings import FastTier as Settings  # noqa: E402
from hpc.runtime.checkpoint.tiers.fast_tier import FastTier  # noqa: E402
from hpc.runtime.checkpoint.tiers.node_store import NodeStore  # noqa: E402
from hpc.runtime.process.training_state import TrainingState  # noqa: E402

UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    return int(float(text[:-1]) * UNITS[text[-1].upper()]) if text[-1].upper() in UNITS else int(text)


def one_rank(rank: int, args, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    world = args.ranks
    dist.init_process_group("gloo", rank=rank, world_size=world)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for text in args.sizes:
        size = parse_size(text)
        model = torch.nn.Linear(max(1, size // 4 // 1024), 1024, bias=False).to(device)
        nbytes = model.weight.numel() * 4
        for replicas in (1, 2) if world > 1 else (1,):
            base = Path(tempfile.mkdtemp(prefix=f"fast-bench-r{rank}-", dir=args.dir))
            node = NodeStore(base, f"bench{replicas}")
            node.open()
            opt = torch.optim.SGD(model.parameters(), lr=0.0)
            tier = FastTier(node, rank, world, 1, TrainingState(models=[model], optimizers=[opt]),
                            types.SimpleNamespace(scaler=None), types.SimpleNamespace(unwrap=lambda m: m),
                            Settings(enabled=True, replicas=replicas, overlap_copy=args.overlap > 0),
                            f"bench{replicas}")
            stalls, background = [], []
            for step in range(1, args.saves + 1):
                dist.barrier()
                stalls.append(tier.save(step, {"step": step, "micro_step": step, "strategy": "ddp",
                                               "loaders": []}))
                if args.overlap:
                    time.sleep(args.overlap * args.step)  # the next forward and backward
                    opt.step()  # waits in its pre-hook for the copy, if it has not landed
                    stalls[-1] += tier._deferred.take_waited()
                started = time.monotonic()
                tier.wait()
                background.append(time.monotonic() - started + stalls[-1])
                model.weight.data.add_(1.0)
            tier.close(remove=True)
            os.rmdir(base)
            later = slice(1, None) if len(stalls) > 1 else slice(None)
            rows.append((text, nbytes, replicas, statistics.median(stalls[later]),
                         statistics.median(background[later])))
        del model
    if rank == 0:
        results.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["3M", "1G"])
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument("--step", type=float, default=1.0, help="a training step's seconds, for the %% column")
    parser.add_argument("--ranks", type=int, choices=(1, 2), default=2)
    parser.add_argument("--overlap", type=float, default=0.0,
                        help="overlap_copy on; the forward and backward take this share of --step")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=one_rank, args=(r, args, port, results)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    rows = results.get(timeout=3600)
    for p in procs:
        p.join()
    by = {(r[0], r[2]): r for r in rows}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"fast-tier save, {args.ranks} rank(s) on {socket.gethostname()} ({device}, {os.cpu_count()} CPUs), "
          f"tier {args.dir}, median of saves 2..{args.saves}"
          + (f", copy overlapped with a {args.overlap * args.step:g} s forward and backward" if args.overlap else ""))
    print(f"| state per rank | stall (s) | % of a {args.step:g} s step | write GB/s | write+replicate GB/s |")
    print("|---|---|---|---|---|")
    for text in args.sizes:
        one, two = by[(text, 1)], by.get((text, 2))
        nbytes, stall = one[1], statistics.median([one[3]] + ([two[3]] if two else []))
        replicated = f"{nbytes / two[4] / 1e9:.2f}" if two else "(one rank)"
        print(f"| {nbytes / 2**20:.1f} MiB | {stall:.4f} | {100 * stall / args.step:.2f} | "
              f"{nbytes / one[4] / 1e9:.2f} | {replicated} |")


if __name__ == "__main__":
    main()
