"""Score many items with a model in a job that may be preempted: each output is written exactly once.

    hpc launch --nproc 2 scripts/examples/batch_scores.py --items 10000 --out scores
    hpc submit -p slurm-local -N 2 --array 0-3 scripts/examples/batch_scores.py -- --items 100000 --out scores
    hpc status                  # ... items: 41,216 of 100,000 done (41%)

The "model" is a small fixed network over a generated feature vector per item, so the output of item i is the
same whoever computes it, in whatever attempt. Read the outputs back with hpc.inference.read_outputs(OUT).
"""

import argparse
import time

import torch
from torch import nn

from hpc import PartialState
from hpc.inference import BatchInference


def features(indices: range) -> torch.Tensor:
    """Item i's input: a vector that depends on i alone (a dataset would load it here)."""
    g = torch.Generator().manual_seed(0)
    basis = torch.randn(16, generator=g)
    ids = torch.tensor(list(indices), dtype=torch.float32).unsqueeze(1)
    return torch.sin(ids * 0.01 + basis)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--out", default="scores")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per chunk (to watch a preemption)")
    args = parser.parse_args()

    state = PartialState()
    torch.manual_seed(0)  # the same model on every rank and attempt
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).eval()

    job = BatchInference(args.out, num_items=args.items, chunk_size=args.chunk_size)
    state.print(f"{args.items} items in chunks of {args.chunk_size}; this rank does {len(job)} chunks")
    for chunk in job:
        with torch.no_grad():
            scores = model(features(chunk.indices)).squeeze(1)
        time.sleep(args.sleep)
        chunk.commit([round(float(s), 6) for s in scores])
    summary = job.finish()
    state.print(f"done: {summary['items_done']} of {summary['num_items']} items committed"
                + (" (complete)" if summary["complete"] else " (other ranks or tasks still working)"))


if __name__ == "__main__":
    main()
