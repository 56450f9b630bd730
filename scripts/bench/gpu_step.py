#!/usr/bin/env python3
"""Training step of a real transformer on one GPU: hpc beside raw torch and Accelerate, alternated.

    python scripts/bench/gpu_step.py [--rounds 2] [--steps 30] [--batch 8] [--seq 1024] [--accelerate-path DIR]

A GPT-2 124M (transformers.GPT2Config defaults: 12 layers, width 768), built from its config (nothing is
downloaded), AdamW, bf16, on random token ids. Strategies: DDP and FSDP2 (each block, then the model), one rank
(LOCAL_RANK=0, WORLD_SIZE=1: every implementation starts its process group and wraps the model as on a cluster).
Implementations: "torch" (DDP(model) with autocast; fully_shard with a bf16 MixedPrecisionPolicy), hpc's
Accelerator and Accelerate's (mixed_precision="bf16", an FSDP plugin for FSDP2), each in a fresh process per
round, the implementations' order rotated each round. Rows: the median step over the rounds' timed steps (after
5 warm-up steps, CUDA-synchronised), peak GPU memory allocated, tokens/s, and the ratio to raw torch.

Without a CUDA GPU it refuses in one line (exit 2): there is nothing to measure on a CPU.
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

IMPLS = ("torch", "hpc", "accelerate")
STRATEGIES = ("ddp", "fsdp")
WARMUP = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(seq: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_positions=seq))


def _torch_setup(strategy: str, model):
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    model = model.cuda()
    if strategy == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
        autocast = True
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        autocast = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return model, step


def _accelerator_setup(impl: str, strategy: str, model):
    import torch

    if impl == "hpc":
        from hpc import Accelerator, FullyShardedDataParallelPlugin
    else:
        from accelerate import Accelerator, FullyShardedDataParallelPlugin
    plugin = None
    if strategy == "fsdp":
        os.environ["ACCELERATE_USE_FSDP"] = "true"
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=["GPT2Block"])
    acc = Accelerator(mixed_precision="bf16", fsdp_plugin=plugin)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)

    def step(ids):
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return model, step


def worker(impl: str, strategy: str, steps: int, batch: int, seq: int) -> dict:
    import torch

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(_free_port()))
    torch.cuda.set_device(0)
    model = _model(seq)
    model, step = _torch_setup(strategy, model) if impl == "torch" else _accelerator_setup(impl, strategy, model)
    ids = torch.randint(0, 50257, (batch, seq), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    times, losses = [], []
    for i in range(WARMUP + steps):
        if i == WARMUP:
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = step(ids)
        torch.cuda.synchronize()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
        losses.append(float(loss))
    return {"times": times, "peak": torch.cuda.max_memory_allocated(), "wrapper": type(model).__name__,
            "loss": losses[-1]}


def run(impl: str, strategy: str, args, acc_path: str | None) -> dict | str:
    env = dict(os.environ)
    if impl == "accelerate" and acc_path:
        env["PYTHONPATH"] = acc_path + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--worker", impl, "--strategy", strategy, "--steps", str(args.steps),
           "--batch", str(args.batch), "--seq", str(args.seq)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["failed"])[-1][:160]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _accelerate_path(path: str | None) -> str | None:
    env = dict(os.environ, PYTHONPATH=path or os.environ.get("PYTHONPATH", ""))
    ok = subprocess.run([sys.executable, "-c", "import accelerate"], env=env, capture_output=True).returncode == 0
    return (path or "") if ok else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--accelerate-path", default=None)
    parser.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--strategy", choices=STRATEGIES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.strategy, args.steps, args.batch, args.seq)))
        return
    import torch

    if not torch.cuda.is_available():
        print("gpu_step: no CUDA GPU on this machine; nothing measured (run it where one is lent)")
        sys.exit(2)
    from hpc.cli.output import table

    acc_path = _accelerate_path(args.accelerate_path)
    impls = [i for i in IMPLS if i != "accelerate" or acc_path is not None]
    results: dict = {}
    for strategy in args.strategies.split(","):
        for r in range(args.rounds):
            order = impls[r % len(impls):] + impls[:r % len(impls)]  # who goes first changes every round
            for impl in order:
                out = run(impl, strategy, args, acc_path)
                slot = results.setdefault((strategy, impl), {"times": [], "peak": 0, "error": None})
                if isinstance(out, str):
                    slot["error"] = out
                    continue
                slot["times"] += out["times"]
                slot["peak"] = max(slot["peak"], out["peak"])
                slot.update(wrapper=out["wrapper"], loss=out["loss"])
    tokens = args.batch * args.seq
    rows = []
    for (strategy, impl), slot in results.items():
        if not slot["times"]:
            rows.append([strategy, impl, "failed: " + (slot["error"] or ""), "", "", "", "", ""])
            continue
        ms = statistics.median(slot["times"]) * 1e3
        base = results.get((strategy, "torch"), {}).get("times")
        ratio = f"{ms / (statistics.median(base) * 1e3):.3f}" if base else ""
        rows.append([strategy, impl, f"{ms:.1f}", ratio, f"{tokens / ms * 1e3:,.0f}",
                     f"{slot['peak'] / 2**30:.2f}", slot.get("wrapper", ""), f"{slot.get('loss', 0):.3f}"])
    print(f"GPT-2 124M from config, bf16, AdamW, batch {args.batch} x {args.seq} tokens, one rank; "
          f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; {args.rounds} alternated rounds x "
          f"{args.steps} steps (after {WARMUP} warm-up)"
          + ("" if acc_path is not None else "; accelerate not importable (--accelerate-path DIR)"))
    print(table(["strategy", "impl", "median step ms", "vs torch", "tokens/s", "peak GiB", "model", "last loss"],
                rows))


if __name__ == "__main__":
    main()
