#!/usr/bin/env python3
"""Start-up of a torchrun job's processes: torch's own agent (new Pythons that import torch again) against hpc's
(`python -m hpc.runtime.launch.warm_launch`: workers forked from the agent, torch already imported).

    python scripts/bench/warm_start.py [--repeat 5] [--nproc 2]

Each run starts `--standalone --nproc_per_node N` on a script that makes an Accelerator, prepares a small model and
takes one step, as a job's (re)start does before its first step; the table gives the wall seconds of the whole run
(the agent's own start included, the same for both) and of the agent's start to the first step's end, median
[min-max]. On this machine: no GPU, torch 2.13 CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys, time
import torch
from hpc import Accelerator
acc = Accelerator(cpu=True)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
loss = model(torch.randn(8, 64)).sum()
acc.backward(loss)
opt.step()
if acc.is_main_process:
    open(sys.argv[1], "w").write(str(time.time()))
acc.end_training()
"""


def one(module: str, nproc: int, folder: Path) -> tuple[float, float]:
    script, mark = folder / "first_step.py", folder / "mark"
    script.write_text(SCRIPT)
    mark.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env = {k: v for k, v in env.items() if not k.startswith(("HPC_", "SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", module, "--standalone", f"--nproc_per_node={nproc}", str(script),
                           str(mark)], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"{module} failed:\n{proc.stderr[-3000:]}")
    return end - start, float(mark.read_text()) - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    agents = {"torch.distributed.run": [], "hpc.runtime.launch.warm_launch": []}
    with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
        for _ in range(args.repeat):  # interleaved: a change in the machine's load hits both alike
            for module, runs in agents.items():
                runs.append(one(module, args.nproc, Path(tmp)))
    print(f"| agent ({args.repeat} runs, {args.nproc} processes; median [min-max] s) | whole run | to the first "
          "step |")
    print("|---|---|---|")
    for module, runs in agents.items():
        cells = []
        for i in (0, 1):
            values = [r[i] for r in runs]
            cells.append(f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]")
        print(f"| `{module}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
