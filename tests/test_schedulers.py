"""Schedulers step as Accelerate's: num_processes times per optimizer step, so the same schedule gives the same
learning rates; once with split_batches; every call without the optimizer link; never past OneCycle's end."""

import json
import os
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent("""
    import json, sys
    import torch
    from hpc import Accelerator
    from hpc.runtime.configuration import DataLoaderConfiguration, GradientAccumulationPlugin

    def run(steps, **kw):
        acc = Accelerator(**kw)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 1.0 / (n + 1))  # lr = 1 / (steps taken + 1)
        model, opt, sched = acc.prepare(model, opt, sched)
        rates = []
        for _ in range(steps):
            with acc.accumulate(model):
                acc.backward(model(torch.ones(1, 2)).sum())
                opt.step()
                sched.step()
                opt.zero_grad()
            rates.append(round(sched.get_last_lr()[0], 6))
        return rates

    out = {
        "plain": run(3),
        "accumulate": run(4, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2)),
        "split_batches": run(3, dataloader_config=DataLoaderConfiguration(split_batches=True)),
        "unlinked": run(3, step_scheduler_with_optimizer=False),
    }
    acc = Accelerator()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=5)
    model, opt, one_cycle = acc.prepare(model, opt, one_cycle)
    for _ in range(4):  # 8 steps asked of a 5-step schedule: it stops at its end instead of raising
        acc.backward(model(torch.ones(1, 2)).sum())
        opt.step()
        one_cycle.step()
        opt.zero_grad()
    out["one_cycle_steps"] = one_cycle.last_epoch
    if acc.is_main_process:
        json.dump(out, open(sys.argv[1], "w"))
""")


def test_schedulers_step_as_accelerates_on_two_ranks(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "ACCELERATE_"))}
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", "worker.py", "out.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["plain"] == [round(1 / n, 6) for n in (3, 5, 7)]  # two scheduler steps per optimizer step
    assert out["accumulate"] == [1.0, round(1 / 3, 6), round(1 / 3, 6), round(1 / 5, 6)]  # only on window ends
    assert out["split_batches"] == [round(1 / n, 6) for n in (2, 3, 4)]  # global batches: once per step
    assert out["unlinked"] == [round(1 / n, 6) for n in (2, 3, 4)]  # every call
    assert out["one_cycle_steps"] == 5
