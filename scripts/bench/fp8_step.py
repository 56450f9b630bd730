#!/usr/bin/env python3
"""fp8 against bf16 on one GPU: the loss over a few hundred steps, the step time and the peak memory.

    python scripts/bench/fp8_step.py [--steps 200] [--strategies fsdp,ddp] [--batch 8] [--seq 1024]

A Llama of 12 layers, width 1024 (every Linear's dimensions divide by 16, as fp8 matmuls need), built from its
config, AdamW, hpc's Accelerator with mixed_precision "bf16" and then "fp8" (torchao's Float8Linear; under FSDP2 the
shards all-gathered in fp8), each in a fresh process on the same data: token sequences of a fixed random Markov
chain (each token's successor is one of four, so the loss falls well below log(vocab) and a precision that learns
worse shows). Rows: median step ms (after 10 warm-up steps, CUDA-synchronised), peak GPU memory allocated, the mean
loss of the first and the last 20 steps, and the last's relative difference to bf16's.

Without a CUDA GPU of compute capability 8.9 or more it refuses in one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

WARMUP, WINDOW, VOCAB = 10, 20, 32000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batches(steps: int, batch: int, seq: int):
    """A Markov chain: each token is followed by one of its four successors, chosen at random."""
    import torch

    g = torch.Generator().manual_seed(0)
    successors = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)
    ids = torch.empty(steps, batch, seq, dtype=torch.long)
    ids[:, :, 0] = torch.randint(0, VOCAB, (steps, batch), generator=g)
    choice = torch.randint(0, 4, (steps, batch, seq), generator=g)
    for i in range(1, seq):
        ids[:, :, i] = successors[ids[:, :, i - 1], choice[:, :, i]]
    return ids


def worker(precision: str, strategy: str, steps: int, batch: int, seq: int) -> dict:
    import torch
    import transformers

    from hpc import Accelerator, FullyShardedDataParallelPlugin

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(_free_port()))
    plugin = None
    if strategy == "fsdp":
        os.environ["ACCELERATE_USE_FSDP"] = "true"
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    acc = Accelerator(mixed_precision=precision, fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=1024, intermediate_size=4096, num_hidden_layers=12, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=VOCAB, max_position_embeddings=seq))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, opt = acc.prepare(model, opt)
    data = _batches(WARMUP + steps, batch, seq)
    times, losses = [], []
    for i in range(WARMUP + steps):
        if i == WARMUP:
            torch.cuda.reset_peak_memory_stats()
        ids = data[i].cuda(non_blocking=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
        losses.append(float(loss))
    return {"times": times, "peak": torch.cuda.max_memory_allocated(), "losses": losses,
            "fp8": acc.fp8_backend}


def run(precision: str, strategy: str, args) -> dict | str:
    cmd = [sys.executable, __file__, "--worker", precision, "--strategy", strategy, "--steps", str(args.steps),
           "--batch", str(args.batch), "--seq", str(args.seq)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["failed"])[-1][:160]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--strategies", default="fsdp")
    parser.add_argument("--worker", choices=("bf16", "fp8"), help=argparse.SUPPRESS)
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.strategy, args.steps, args.batch, args.seq)))
        return
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) < (8, 9):
        print("fp8_step: no CUDA GPU with fp8 tensor cores (compute capability 8.9+) here; nothing measured")
        sys.exit(2)
    from hpc.cli.output import table

    rows = []
    for strategy in args.strategies.split(","):
        found = {p: run(p, strategy, args) for p in ("bf16", "fp8")}
        base = found["bf16"]
        for precision, out in found.items():
            if isinstance(out, str):
                rows.append([strategy, precision, "failed: " + out, "", "", "", "", ""])
                continue
            ms = statistics.median(out["times"]) * 1e3
            first, last = (statistics.mean(out["losses"][:WINDOW]), statistics.mean(out["losses"][-WINDOW:]))
            vs = diff = ""
            if isinstance(base, dict):
                vs = f"{ms / (statistics.median(base['times']) * 1e3):.3f}"
                base_last = statistics.mean(base["losses"][-WINDOW:])
                diff = f"{(last - base_last) / base_last:+.2%}"
            rows.append([strategy, precision, f"{ms:.1f}", vs, f"{out['peak'] / 2**30:.2f}", f"{first:.3f}",
                         f"{last:.3f}", diff])
    print(f"Llama 12 x 1024 from config, AdamW, batch {args.batch} x {args.seq} tokens of a Markov chain, one rank, "
          f"{args.steps} steps (after {WARMUP} warm-up); {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(table(["strategy", "precision", "median step ms", "vs bf16", "peak GiB", f"loss first {WINDOW}",
                 f"loss last {WINDOW}", "last vs bf16"], rows))


if __name__ == "__main__":
    main()
