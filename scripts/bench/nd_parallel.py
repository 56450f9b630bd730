#!/usr/bin/env python3
"""Step time and memory per rank of one small transformers Llama on 4 ranks, under each mesh hpc builds from
Accelerate's ParallelismConfig, beside DDP on the same global batch.

    python scripts/bench/nd_parallel.py [--steps 30] [--hidden 256] [--layers 4]

Under cp the step opens maybe_context_parallel (each rank a quarter or a half of every sequence). Each mesh is
one `hpc launch --nproc 4` of this file (CPU and gloo where there is no GPU): the median time of the
steps after 5 warm-up ones, the parameter elements each rank holds, and the last loss (equal across meshes up to
rounding: the same samples each step). On 2 cores, 4 ranks share them: the figures rank communication patterns,
they are not a throughput claim.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MESHES = {"ddp": None, "tp 2 x dp_shard 2": {"tp_size": 2, "dp_shard_size": 2},
          "hsdp 2 x 2": {"dp_replicate_size": 2, "dp_shard_size": 2}, "fsdp 4": {"dp_shard_size": 4},
          "cp 2 x dp_shard 2": {"cp_size": 2, "dp_shard_size": 2}, "cp 4": {"cp_size": 4}}


def rank_main(spec: dict) -> None:
    import statistics

    import torch
    import transformers

    from hpc import Accelerator, ParallelismConfig, set_seed

    mesh = spec["mesh"]
    acc = Accelerator(parallelism_config=ParallelismConfig(**mesh) if mesh else None)
    set_seed(0)
    config = transformers.LlamaConfig(hidden_size=spec["hidden"], intermediate_size=4 * spec["hidden"],
                                      num_hidden_layers=spec["layers"], num_attention_heads=8, num_key_value_heads=4,
                                      vocab_size=1024)
    model = transformers.LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cp = (mesh or {}).get("cp_size", 1)
    dp = acc.num_processes // ((mesh or {}).get("tp_size", 1) * cp)
    ids = torch.randint(0, 1024, (spec["steps"] * 8, 128), generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(ids, batch_size=8 // dp)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    times, loss = [], None
    for batch in loader:
        start = time.perf_counter()
        if cp > 1:  # each rank a 1/cp of every sequence; the loss the token mean, as the other meshes'
            shifted = torch.nn.functional.pad(batch[:, 1:], (0, 1), value=-100)
            items = (shifted != -100).sum() / cp
            labels = batch.clone()
            with acc.maybe_context_parallel(buffers=[batch, labels, shifted], buffer_seq_dims=[1, 1, 1]):
                loss = model(input_ids=batch, labels=labels, shift_labels=shifted, num_items_in_batch=items).loss
                acc.backward(loss)
        else:
            loss = model(input_ids=batch, labels=batch).loss
            acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        acc.wait_for_everyone()
        times.append(time.perf_counter() - start)
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    loss = acc.reduce(loss.detach(), "mean").item()
    if acc.is_main_process:
        print("RESULT " + json.dumps({"median_s": statistics.median(times[5:]), "held": held, "loss": loss}))
    acc.end_training()


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):
        rank_main(json.loads(sys.argv[1]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    rows = []
    for name, mesh in MESHES.items():
        spec = {"mesh": mesh, "steps": args.steps, "hidden": args.hidden, "layers": args.layers}
        done = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "4", __file__, json.dumps(spec)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{name}: {done.stderr[-2000:]}")
        rows.append((name, json.loads(line[7:])))
        print(f"  {name} done", file=sys.stderr)
    print(f"{'mesh':<20} {'step_ms':>8} {'params/rank':>12} {'last loss':>10}")
    for name, r in rows:
        print(f"{name:<20} {r['median_s'] * 1000:8.1f} {r['held']:12,} {r['loss']:10.5f}")


if __name__ == "__main__":
    main()
