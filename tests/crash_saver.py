"""Saves checkpoints in a loop until killed: the victim of the crash-safety test and benchmark.

    python crash_saver.py PROJECT_DIR MEGABYTES

Every parameter of checkpoint step N holds the value N, so a loaded checkpoint proves which save it came
from. Saves alternate between synchronous and background; prints "ready" once torch is imported.
"""

import sys

import torch

from hpc import Accelerator


def main():
    project, megabytes = sys.argv[1], float(sys.argv[2])
    acc = Accelerator(project_dir=project, checkpoint_keep=2)
    n = int(megabytes * 2**20 / 4 / 4)
    model = torch.nn.Sequential(*[torch.nn.Linear(n // 1024, 1024, bias=False) for _ in range(4)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(step)
        acc._completed_steps = step
        acc.save_state(async_save=step % 2 == 0)


if __name__ == "__main__":
    main()
