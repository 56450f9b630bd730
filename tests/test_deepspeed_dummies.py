"""DummyOptim/DummyScheduler: a DeepSpeed config that defines its own optimizer and scheduler trains with them
(the config's "auto"s filled from the dummies), on 2 real ranks; elsewhere the dummies are a one-line error."""

import json
import math
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent("""
    import json, sys, torch
    from hpc import Accelerator
    from hpc.utils import DeepSpeedPlugin, DummyOptim, DummyScheduler
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                        "warmup_num_steps": "auto"}},
           "zero_optimization": {"stage": 2}}
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=cfg))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    before = model.weight.detach().clone()
    opt = DummyOptim(model.parameters(), lr=0.1, weight_decay=0.01)
    sched = DummyScheduler(opt, total_num_steps=10, warmup_num_steps=4)
    model, opt, sched = acc.prepare(model, opt, sched)
    lrs = []
    for step in range(6):
        acc.backward(model(torch.ones(2, 4)).sum())
        opt.step(); sched.step(); opt.zero_grad()   # the engine steps the scheduler: sched.step() adds nothing
        lrs.append(sched.get_last_lr()[0])
    group = opt.optimizer.param_groups[0] if hasattr(opt.optimizer, "param_groups") else {}
    with open(f"{sys.argv[1]}/rank{acc.process_index}.json", "w") as f:  # two ranks' prints may interleave
        json.dump({"lrs": lrs, "in_config": "optimizer" in acc.state.deepspeed_plugin.deepspeed_config,
                   "weight_decay": group.get("weight_decay"),
                   "moved": not torch.equal(before, acc.unwrap_model(model).weight.detach())}, f)
    acc.end_training()
""")


def test_a_deepspeed_configs_own_optimizer_and_scheduler_train(tmp_path):
    (tmp_path / "w.py").write_text(WORKER)
    run = subprocess.run([sys.executable, "-m", "hpc", "launch", "--cpu", "--num_processes", "2",
                          str(tmp_path / "w.py"), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert len(outs) == 2 and outs[0] == outs[1]
    out = outs[0]
    # DeepSpeed's WarmupLR (log warm-up) from 0 to the DummyOptim's 0.1 over the DummyScheduler's 4 steps
    expected = [0.1 * min(1.0, math.log(k + 1) / math.log(4)) for k in range(6)]
    assert [round(x, 6) for x in out["lrs"]] == [round(x, 6) for x in expected]
    assert out["in_config"] and out["weight_decay"] == 0.01 and out["moved"]


def test_dummies_without_deepspeed_are_one_line():
    code = textwrap.dedent("""
        import torch
        from hpc import Accelerator
        from hpc.utils import DummyOptim
        acc = Accelerator(cpu=True)
        model = torch.nn.Linear(2, 1)
        acc.prepare(model, DummyOptim(model.parameters()))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert ("DummyOptim stands for the optimizer or scheduler of a DeepSpeed config"
            in run.stderr.strip().splitlines()[-1])
