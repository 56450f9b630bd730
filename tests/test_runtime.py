"""Accelerator on CPU + gloo with real processes: parity with one process, accumulation, fp16, metrics."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "runtime_worker.py"


def run_worker(tmp_path, nproc, *args):
    out = tmp_path / f"out-{nproc}-{'-'.join(args)}.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "TORCHELASTIC"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    argv = ([sys.executable, "-m", "hpc", "launch", "--nproc", str(nproc)] if nproc > 1 else [sys.executable])
    proc = subprocess.run([*argv, str(WORKER), args[0], str(out), *args[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def max_diff(a, b):
    return max(abs(x - y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def test_two_rank_ddp_equals_one_process_on_the_concatenated_batches(tmp_path):
    two = run_worker(tmp_path, 2, "parity", "1")            # 2 ranks x batch 4
    one = run_worker(tmp_path, 1, "parity", "1", "2")       # 1 process x batch 8: the same samples per step
    assert max_diff(two["params"], one["params"]) < 1e-6


def test_accumulation_k4_on_two_ranks_equals_one_batch_four_times_as_large(tmp_path):
    acc = run_worker(tmp_path, 2, "parity", "4")            # 2 ranks x batch 4 x 4 micro-steps
    big = run_worker(tmp_path, 1, "parity", "1", "8")       # 1 process x batch 32
    assert max_diff(acc["params"], big["params"]) < 1e-6


def test_exactly_one_allreduce_per_accumulation_window(tmp_path):
    got = run_worker(tmp_path, 2, "comm", "4")
    assert got["allreduces"] == got["windows"] == 5


def test_gather_for_metrics_returns_exactly_the_dataset(tmp_path):
    got = run_worker(tmp_path, 2, "gather")                 # 10 samples, batch 2, 2 ranks: last round padded
    assert got["seen"] == list(range(10))
    assert got["plain_gather_len"] == 6


@pytest.fixture
def single(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "HPC_")):
            monkeypatch.delenv(key)


def test_fp16_skips_an_inf_step_and_halves_the_scale(single):
    from hpc import Accelerator

    acc = Accelerator(mixed_precision="fp16", cpu=True)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 1)
    net, opt = acc.prepare(net, opt)
    sched = acc.prepare(torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=1, gamma=0.5))
    before = [p.detach().clone() for p in net.parameters()]
    scale = acc.precision.scaler.get_scale()
    loss = net(torch.randn(8, 4)).float().pow(2).mean()
    acc.backward(loss)
    next(net.parameters()).grad[0, 0] = float("inf")
    opt.step()
    sched.step()
    assert acc.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert acc.precision.scaler.get_scale() == scale / 2
    assert sched.get_last_lr() == [0.1]  # the scheduler does not step after a skipped step
    opt.zero_grad()
    acc.backward(net(torch.randn(8, 4)).float().pow(2).mean())
    opt.step()
    sched.step()
    assert not acc.optimizer_step_was_skipped and sched.get_last_lr() == [0.05]


def test_bf16_runs(single):
    from hpc import Accelerator

    acc = Accelerator(mixed_precision="bf16", cpu=True)
    net, opt = acc.prepare(torch.nn.Linear(4, 1), torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1))
    out = net(torch.randn(8, 4))
    assert out.dtype == torch.bfloat16
    loss = out.float().pow(2).mean()
    acc.backward(loss)
    assert math.isfinite(loss.item())


def test_the_four_line_example_runs_unchanged_under_hpc_launch(tmp_path):
    example = tmp_path / "four.py"
    example.write_text(
        "import torch\nfrom hpc import Accelerator\naccelerator = Accelerator()\n"
        "dataset = torch.randn(64, 10)\nmodel = torch.nn.Linear(10, 2)\n"
        "optimizer = torch.optim.Adam(model.parameters())\n"
        "dataloader = torch.utils.data.DataLoader(dataset, batch_size=32)\n"
        "model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)\n"
        "for batch in dataloader:\n    optimizer.zero_grad()\n    loss = model(batch).mean()\n"
        "    accelerator.backward(loss)\n    optimizer.step()\n"
        # one write per line: two ranks share the pipe, and a short write is not interleaved
        "import sys\nsys.stdout.write(f'rank {accelerator.process_index} of {accelerator.num_processes} "
        "{accelerator.distributed_type}\\n')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))}
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", str(example)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split("\n")[:2]) == ["rank 0 of 2 ddp", "rank 1 of 2 ddp"]
