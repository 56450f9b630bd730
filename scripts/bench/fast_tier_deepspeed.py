#!/usr/bin/env python3
"""What DeepSpeed's saves cost the training loop: the fast tier's (node memory, every step) against the shared
tier's (a save_state onto disk), measured from outside hpc, by the loop's own clock.

    python scripts/bench/fast_tier_deepspeed.py [--sizes 16M 256M] [--stage 2] [--steps 8] [--dir /dev/shm]

Two processes on this machine stand for two nodes (gloo, LOCAL_WORLD_SIZE 1), training a model of the given size
(weights; Adam's state and fp32 partitions come on top) under ZeRO ``--stage`` through hpc's Accelerator. Each size
runs twice: with the fast tier off, then on (every ``--every`` steps, replicas 2: each rank's files also go to the
other). Per size, rank 0's medians over the steps after the first two:
  step off / on   a training step's wall time without the fast tier, and with it for the steps that saved (the
                  save is made at the next batch: its stall and any wait for the previous save's background half)
  stall           on minus off: what a fast save holds the loop (the engine writes into node memory)
  hpc's stall     what hpc reports for it (the timeline's progress.fast: stall_s over its saves): the save call
                  alone; the writer thread's checksums and copy to the peer take CPU from the steps around it
  hpc's writer busy  the writer thread's seconds at work a save, as hpc reports them (progress.fast.busy_s)
  run slower by   all steps after the first two, on against off: what the tier costs the run
  fast files      what one rank's fast folder holds
  shared save     one accelerator.save_state() onto disk (the shared tier's save, at the end of the run)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}

WORKER = """
import json, os, sys, time, torch
from hpc import Accelerator
from hpc.utils import DeepSpeedPlugin
spec = json.loads(sys.argv[1])
acc = Accelerator(cpu=True, project_dir=spec["project"],
                  deepspeed_plugin=DeepSpeedPlugin(zero_stage=spec["stage"]))
width = 1024
model = torch.nn.Linear(max(1, spec["bytes"] // 4 // width), width, bias=False)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = torch.utils.data.TensorDataset(torch.randn(spec["steps"], model.in_features))
loader = torch.utils.data.DataLoader(data, batch_size=1)
model, opt, loader = acc.prepare(model, opt, loader)
times, last = [], time.perf_counter()
for (x,) in loader:
    acc.backward(model(x).float().pow(2).mean())
    opt.step()
    opt.zero_grad()
    now = time.perf_counter()
    times.append(now - last)
    last = now
acc.wait_for_everyone()
started = time.perf_counter()
acc.save_state(os.path.join(spec["project"], "shared"))
shared = time.perf_counter() - started
if acc.is_main_process:
    with open(spec["out"], "w") as f:
        json.dump({"times": times, "shared": shared}, f)
acc.end_training()
"""


def parse_size(text: str) -> int:
    return int(float(text[:-1]) * UNITS[text[-1].upper()]) if text[-1].upper() in UNITS else int(text)


def run(tmp: Path, size: int, args, fast: bool) -> dict:
    from hpc.contract.launch_settings import FastTier
    from hpc.contract.runtime_config import RuntimeConfig

    work = Path(tempfile.mkdtemp(dir=tmp))
    (work / "job" / "tasks").mkdir(parents=True)
    memory = Path(tempfile.mkdtemp(dir=args.dir))
    settings = FastTier(enabled=fast, directory=str(memory), every=args.every)
    RuntimeConfig(fast_tier=settings).write(work / "runtime.json")
    (work / "w.py").write_text(WORKER)
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    spec = {"project": str(work / "run"), "out": str(work / "out.json"), "bytes": size, "stage": args.stage,
            "steps": args.steps}
    env = {**os.environ, "PYTHONPATH": str(REPO), "HPC_JOB_DIR": str(work / "job"),
           "MASTER_ADDR": socket.gethostname(), "MASTER_PORT": str(port), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
           "OMP_NUM_THREADS": "1",
           "HPC_RUNTIME_CONFIG": str(work / "runtime.json")}
    procs = [subprocess.Popen([sys.executable, str(work / "w.py"), json.dumps(spec)], cwd=work,
                              env={**env, "RANK": str(r), "LOCAL_RANK": "0", "GROUP_RANK": str(r)},
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    files = 0
    out: dict = {}
    errs = [p.communicate(timeout=1800)[1] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"a rank failed:\n{errs[0][-3000:]}\n{errs[1][-3000:]}")
    out.update(json.loads((work / "out.json").read_text()))
    if fast:  # the run ended: the tier's folder is gone; its size is the timeline's
        lines = [json.loads(x) for x in (work / "job" / "tasks" / "0.timeline").read_text().splitlines()]
        fast = [e["fast"] for e in lines if e.get("event") == "progress" and e.get("fast")]
        files = max((f.get("bytes", 0) for f in fast), default=0)
        saves = sum(f.get("n", 0) for f in fast)
        out["reported"] = sum(f.get("stall_s", 0) for f in fast) / saves if saves else float("nan")
        out["busy"] = sum(f.get("busy_s", 0) for f in fast) / saves if saves else float("nan")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(memory, ignore_errors=True)
    return {**out, "files": files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["16M", "256M"])
    parser.add_argument("--stage", type=int, choices=(1, 2, 3), default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument("--every", type=int, default=1, help="steps between fast saves")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for text in args.sizes:
            size = parse_size(text)
            off, on = run(Path(tmp), size, args, False), run(Path(tmp), size, args, True)
            later = slice(2, None)
            step_off = statistics.median(off["times"][later])
            # the steps whose next batch saved (the step after a multiple of --every): the save's stall is in them
            saving = [t for i, t in enumerate(on["times"]) if i >= 2 and i % args.every == 0]
            # what the tier costs the run: all steps after the first two, on against off
            overhead = sum(on["times"][later]) / sum(off["times"][later]) - 1
            rows.append((text, step_off, statistics.median(saving), on["reported"], on["busy"], overhead,
                         on["files"], statistics.median([off["shared"], on["shared"]])))
    print(f"DeepSpeed ZeRO-{args.stage}, 2 ranks on {socket.gethostname()} ({os.cpu_count()} CPUs, gloo), fast tier "
          f"{args.dir} every {args.every} step(s) with replicas 2, median of steps 3..{args.steps} (with a save: "
          "the steps after one)")
    print("| weights | step off (s) | step on (s) | stall (s) | hpc's stall (s) | hpc's writer busy (s) "
          "| run slower by | fast files a rank | shared save_state (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for text, step_off, step_on, reported, busy, overhead, files, shared in rows:
        print(f"| {text} | {step_off:.3f} | {step_on:.3f} | {step_on - step_off:.3f} | {reported:.3f} | {busy:.3f} | "
              f"{100 * overhead:.0f} % | {files / 2**20:.0f} MiB | {shared:.2f} |")


if __name__ == "__main__":
    main()
