#!/usr/bin/env python3
"""Resuming a million batches into an epoch: time from resume_at(0, 1_000_000) to the first batch.

    python scripts/bench/resume_skip.py [--samples 200000000] [--repeats 3]

Rank 0 of 2 (no process group needed to deal indices), batch 32, a map-style dataset whose __getitem__
returns the index and counts its calls (a skipped sample must never be loaded). Rows: the loaders hpc
addresses by position (O(1)), the samplers and batch samplers that can only be iterated (skipped by
consuming indices: proportional to the position), iterating the batch sampler as Accelerate's
skip_first_batches does, and hpc's previous data.py (at a tenth of the size: it builds a Python list of
the whole epoch). Prints medians.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, SequentialSampler  # noqa: E402

from hpc.runtime.configuration import DataLoaderConfiguration  # noqa: E402
from hpc.runtime.data.prepare import PreparedDataLoader  # noqa: E402

BATCH, WORLD, POSITION = 32, 2, 1_000_000


class Indices(Dataset):
    def __init__(self, n):
        self.n, self.loaded = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.loaded += 1
        return i


class Reversed(Sampler):
    """A sampler of the user's that can only be iterated."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))


class IndexedReversed(Reversed):
    """The same order, also readable by position: hpc jumps straight to it."""

    def __getitem__(self, i):
        return self.n - 1 - i


class Blocks:
    """A batch sampler of the user's that can only be iterated: batches of consecutive indices."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return -(-self.n // BATCH)

    def __iter__(self):
        for start in range(0, self.n, BATCH):
            yield list(range(start, min(start + BATCH, self.n)))


class IndexedBlocks(Blocks):
    def __getitem__(self, k):
        return list(range(k * BATCH, min((k + 1) * BATCH, self.n)))


def accelerator(**config):
    class Gradient:
        end_of_dataloader, remainder = False, -1

    env = types.SimpleNamespace(rank=0, world_size=WORLD)
    return types.SimpleNamespace(state=types.SimpleNamespace(env=env), device=torch.device("cpu"),
                                 gradient_state=Gradient(), dataloader_config=DataLoaderConfiguration(**config),
                                 _beat=lambda what: None, _resume_if_asked=lambda: None, seed=0)


def hpc_resume(make_loader, n, **config):
    data = Indices(n)
    dl = PreparedDataLoader(make_loader(data), accelerator(**config), 0)
    start = time.perf_counter()
    dl.resume_at(0, POSITION)
    first = next(iter(dl))
    took = time.perf_counter() - start
    expected_first = None if config or make_loader is CASES["seeded shuffle"] else POSITION * WORLD * BATCH
    assert expected_first is None or first[0].item() in (expected_first, n - 1 - expected_first), first[:3]
    return took, data.loaded


def iterate_batch_sampler(n):
    """What skipping by iterating costs: Accelerate's skip_first_batches over its BatchSamplerShard walks the
    underlying batch sampler through every rank's batches (indices only, nothing loaded)."""
    batches = BatchSampler(SequentialSampler(range(n)), BATCH, False)
    start = time.perf_counter()
    it = iter(batches)
    next(itertools.islice(it, POSITION * WORLD, POSITION * WORLD), None)
    next(it)
    return time.perf_counter() - start, None


OLD = """
import sys, time, types, torch
sys.path.insert(0, {root!r})
ns = {{}}
exec(compile({source!r}, "old_data.py", "exec"), ns)
class Grad: end_of_dataloader, remainder = False, -1
env = types.SimpleNamespace(rank=0, world_size={world})
acc = types.SimpleNamespace(state=types.SimpleNamespace(env=env), device=torch.device("cpu"), gradient_state=Grad(),
                            _beat=lambda w: None, _resume_if_asked=lambda: None)
class D(torch.utils.data.Dataset):
    def __len__(self): return {n}
    def __getitem__(self, i): return i
dl = ns["PreparedDataLoader"](torch.utils.data.DataLoader(D(), batch_size={batch}, shuffle={shuffle}), acc, 0)
t = time.perf_counter(); dl.resume_at(0, {position}); next(iter(dl)); print(time.perf_counter() - t)
"""


def old_hpc(n, shuffle):
    """hpc's data.py before this change (git HEAD), in a child process: it lists the whole epoch's order."""
    source = subprocess.run(["git", "show", "HEAD:hpc/runtime/data/prepare.py"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    code = OLD.format(root=str(ROOT), source=source, world=WORLD, n=n, batch=BATCH, shuffle=shuffle,
                      position=min(POSITION, n // (BATCH * WORLD) - 1))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip()), None


CASES = {
    "default sampler": lambda d: DataLoader(d, batch_size=BATCH),
    "seeded shuffle": lambda d: DataLoader(d, batch_size=BATCH, shuffle=True),
    "custom sampler, indexable": lambda d: DataLoader(d, batch_size=BATCH, sampler=IndexedReversed(len(d))),
    "custom batch sampler, indexable": lambda d: DataLoader(d, batch_sampler=IndexedBlocks(len(d))),
    "custom sampler, iterate-only": lambda d: DataLoader(d, batch_size=BATCH, sampler=Reversed(len(d))),
    "custom batch sampler, iterate-only": lambda d: DataLoader(d, batch_sampler=Blocks(len(d))),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=float, default=2e8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = int(args.samples)
    rows = [(f"hpc: {name}", lambda m=make: hpc_resume(m, n)) for name, make in CASES.items()]
    rows.append(("hpc: seeded shuffle, use_seedable_sampler",
                 lambda: hpc_resume(CASES["seeded shuffle"], n, use_seedable_sampler=True, data_seed=3)))
    rows.append(("iterating the batch sampler (Accelerate)", lambda: iterate_batch_sampler(n)))
    small = n // 10
    at = min(POSITION, small // (BATCH * WORLD) - 1)
    rows.append((f"old hpc: default sampler ({small:.0e} samples, at {at:,})", lambda: old_hpc(small, False)))
    rows.append((f"old hpc: seeded shuffle ({small:.0e} samples, at {at:,})", lambda: old_hpc(small, True)))
    print(f"resume_at(0, {POSITION:,}) -> first batch; {n:.0e} samples, batch {BATCH}, rank 0 of {WORLD}; "
          f"median of {args.repeats}")
    print(f"{'case':52} {'seconds':>9} {'samples loaded':>15}")
    for name, run in rows:
        results = [run() for _ in range(args.repeats)]
        loaded = "-" if results[0][1] is None else f"{results[0][1]:,}"  # not counted outside hpc's loader
        print(f"{name:52} {statistics.median(r[0] for r in results):9.3f} {loaded:>15}", flush=True)


if __name__ == "__main__":
    main()
