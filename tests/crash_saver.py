"""Saves checkpoints in a loop until killed: the victim of the crash-safety test and benchmark.

    python crash_saver.py ROOT MEGABYTES

Imports torch once, then for every line "go" on stdin forks a child that saves under ROOT/t<n> until it is killed,
and prints "ready <pid>" (several may be saving at once: the parent reaps children as they die, and kills any still
saving when stdin ends). Every parameter of checkpoint step N holds the value N, so a loaded checkpoint proves
which save it came from. Saves alternate between synchronous and background.
"""

import os
import signal
import sys

import torch

from hpc import Accelerator


def save_forever(project: str, megabytes: float) -> None:
    acc = Accelerator(project_dir=project, checkpoint_keep=2)
    n = int(megabytes * 2**20 / 4 / 4)
    model = torch.nn.Sequential(*[torch.nn.Linear(n // 1024, 1024, bias=False) for _ in range(4)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    step = 0
    while True:
        step += 1
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(step)
        acc.training.completed_steps = step
        acc.save_state(async_save=step % 2 == 0)


def _warm_up() -> None:
    """What a first save would import (the first optimizer alone pulls in torch._dynamo: seconds), done once
    here so that every fork starts saving at once."""
    import hpc.runtime.checkpoint.checkpointer  # noqa: F401
    torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)


def main():
    root, megabytes = sys.argv[1], float(sys.argv[2])
    _warm_up()
    children = set()
    for trial, line in enumerate(sys.stdin):
        if line.strip() != "go":
            break
        pid = os.fork()
        if pid == 0:
            sys.stdin.close()
            save_forever(os.path.join(root, f"t{trial}"), megabytes)
            os._exit(0)
        children.add(pid)
        print(f"ready {pid}", flush=True)
        for child in list(children):  # those killed by now
            if os.waitpid(child, os.WNOHANG)[0]:
                children.discard(child)
    for child in children:  # a saver no one killed would save forever
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


if __name__ == "__main__":
    main()
