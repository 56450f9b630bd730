#!/usr/bin/env python3
"""Per-rank training-state bytes (parameters + gradients + optimizer state) of DDP, FSDP2 and ZeRO-1/2/3.

    python scripts/bench/memory.py [--world 2 4] [--width 256]

Runs the AdamW loop of tests/strategy_worker.py (the one the parity tests use) under each strategy, fp32 and
bf16, at each world size; measures what each rank holds just before its last optimizer step (every live
tensor storage counted once), and prints it next to DDP's and next to `hpc estimate-memory`'s figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hpc.cli.output import table  # noqa: E402
from hpc.cluster.estimate import estimate  # noqa: E402

CASES = [("ddp", "ddp", {}), ("fsdp FULL_SHARD", "fsdp", {"sharding_strategy": "FULL_SHARD",
                                                          "transformer_cls_names_to_wrap": ["Block"]}),
         ("fsdp SHARD_GRAD_OP", "fsdp", {"sharding_strategy": "SHARD_GRAD_OP",
                                         "transformer_cls_names_to_wrap": ["Block"]}),
         ("zero1", "deepspeed", {"zero_stage": 1}), ("zero2", "deepspeed", {"zero_stage": 2}),
         ("zero3", "deepspeed", {"zero_stage": 3})]
ESTIMATOR_NAME = {"ddp": "ddp", "fsdp FULL_SHARD": "fsdp", "fsdp SHARD_GRAD_OP": "fsdp_grad_op",
                  "zero1": "zero1", "zero2": "zero2", "zero3": "zero3"}


def run(world: int, width: int) -> list[dict]:
    specs = [{"strategy": kind, "plugin": plugin, "width": width, "steps": 3, "mixed_precision": precision,
              "label": label} for precision in ("no", "bf16") for label, kind, plugin in CASES]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", str(world),
                               str(ROOT / "tests" / "strategy_worker.py"), json.dumps(specs), str(out)],
                              env=env, cwd=tmp, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"world {world} failed:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    rows = []
    for world in args.world:
        started = time.perf_counter()
        print(f"world {world}: running {2 * len(CASES)} configurations ...", file=sys.stderr, flush=True)
        results = run(world, args.width)
        print(f"world {world}: done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        ddp = {r["spec"]["mixed_precision"]: r["held_bytes"] for r in results if r["spec"]["label"] == "ddp"}
        for r in results:
            label, precision = r["spec"]["label"], r["spec"]["mixed_precision"]
            figure = estimate(r["params"], ESTIMATOR_NAME[label], precision=precision, world_size=world).state_bytes
            rows.append((world, label, precision, f"{r['params']:,}", f"{r['held_bytes']:,}",
                         f"{r['held_bytes'] / ddp[precision]:.3f}", f"{figure:,}",
                         f"{(figure - r['held_bytes']) / r['held_bytes']:+.1%}"))
    print(table(["world", "strategy", "precision", "params", "bytes/rank", "vs ddp", "estimate", "est. error"], rows))


if __name__ == "__main__":
    main()
