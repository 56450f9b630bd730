"""Accelerator in this process, a world of one: fp16 loss scaling, bf16, JSONL tracking (real processes:
tests/test_runtime.py)."""

import json
import math
import os

import pytest
import torch


@pytest.fixture
def single(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "HPC_")):
            monkeypatch.delenv(key)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")  # recorded as absent: what the Accelerator exports goes with the test
        monkeypatch.delenv(key)


def test_fp16_skips_an_inf_step_and_halves_the_scale(single):
    from hpc import Accelerator

    acc = Accelerator(mixed_precision="fp16", cpu=True)
    # Inputs this small keep the second step's scaled gradients far below fp16's 65504: with plain randn inputs 8% of
    # random states overflowed there too, and the test failed after whichever tests had moved the global generator.
    inputs = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(0)) * 0.01
    net = torch.nn.Linear(4, 1)
    with torch.no_grad():
        net.weight.fill_(0.5)
        net.bias.fill_(0.1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net, opt = acc.prepare(net, opt)
    sched = acc.prepare(torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=1, gamma=0.5))
    before = [p.detach().clone() for p in net.parameters()]
    scale = acc.precision.scaler.get_scale()
    loss = net(inputs[0]).float().pow(2).mean()
    acc.backward(loss)
    next(net.parameters()).grad[0, 0] = float("inf")
    opt.step()
    sched.step()
    assert acc.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert acc.precision.scaler.get_scale() == scale / 2
    assert sched.get_last_lr() == [0.1]  # the scheduler does not step after a skipped step
    opt.zero_grad()
    acc.backward(net(inputs[1]).float().pow(2).mean())
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


def test_jsonl_tracking_on_the_main_process(single, tmp_path):
    from hpc import Accelerator

    acc = Accelerator(project_dir=tmp_path, cpu=True)
    acc.init_trackers("run1", config={"lr": 0.1})
    acc.log({"loss": torch.tensor(0.5)}, step=3)
    acc.end_training()
    lines = [json.loads(x) for x in (tmp_path / "logs" / "run1.jsonl").read_text().splitlines()]
    assert lines[0]["config"] == {"lr": 0.1} and (lines[1]["step"], lines[1]["loss"]) == (3, 0.5)


def test_gradient_state_knows_the_accumulation_however_it_was_given(single):
    """As Accelerate's: GradientState().num_steps is what the script gave as a number, too (load_state's skip
    correction reads it)."""
    from hpc import Accelerator, GradientAccumulationPlugin
    from hpc.runtime.process.gradient_state import GradientState

    Accelerator(gradient_accumulation_steps=3, cpu=True)
    assert GradientState().num_steps == 3
    Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=5), cpu=True)
    assert GradientState().num_steps == 5
