"""One rank of a report test: an Accelerate-style loop (nothing of hpc's own in it) that ends in a chosen way.

    python ending_worker.py SPEC_JSON

SPEC keys: out (a folder; "{task}" in it is the array task), steps, sleep (seconds a step), save_at (a step
after which the script calls save_state), end: "return" (the script just returns, as most Accelerate scripts
do), "end_training", "sys_exit0", "sys_exit3", "exception" (a RuntimeError), "kill" (rank 0 SIGKILLs itself).
Rank 0 measures from outside hpc: `out/loop` the loop's start, `out/steps` a "<step> <time>" line after each
optimizer step, `out/end` the moment before the chosen end.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

from hpc import Accelerator


def main() -> None:
    spec = json.loads(sys.argv[1])
    out = Path(spec["out"].replace("{task}", os.environ.get("HPC_TASK", "0")))  # an array's tasks apart
    acc = Accelerator(project_dir=str(out / "project"))
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    model, opt, loader = acc.prepare(model, opt, loader)
    main_rank = acc.is_main_process
    if main_rank:
        out.mkdir(parents=True, exist_ok=True)
        (out / "loop").write_text(f"{time.time()}\n")
    for step, (x, y) in enumerate(loader, start=1):
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        time.sleep(spec.get("sleep", 0))
        if main_rank:
            with open(out / "steps", "a") as f:
                f.write(f"{step} {time.time()}\n")
        if step == spec.get("save_at"):
            acc.save_state()
        if step == spec["steps"]:
            break
    end = spec["end"]
    if main_rank:
        (out / "end").write_text(f"{time.time()}\n")
    if end == "end_training":
        acc.end_training()
    elif end == "sys_exit0":
        sys.exit(0)
    elif end == "sys_exit3":
        sys.exit(3)
    elif end == "exception":
        raise RuntimeError("the script's own error")
    elif end == "kill" and main_rank:
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
