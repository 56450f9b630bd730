"""preemption.lead_time in a real training process: a job whose lead time is too short says so in its log and
records what it measured (the rest: tests/unit/test_lead_time.py)."""

import subprocess
import sys
import textwrap

from hpc.contract import timings as lead_time
from tests.jobhelpers import launch_env

TRAIN = textwrap.dedent("""
    import time, torch
    from hpc import Accelerator
    acc = Accelerator(project_dir="proj")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    for _ in range(4):
        acc.backward(model(torch.ones(2, 4)).sum())
        opt.step()
        opt.zero_grad()
        time.sleep(0.4)
    acc.save_state()
    acc.end_training()
""")


def test_a_slurm_job_whose_lead_time_is_too_short_says_so_and_records_its_timings(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    from hpc.contract.launch_settings import Preemption
    from hpc.contract.runtime_config import RuntimeConfig

    # a job under a scheduler that warns before the limit, with no lead time at all
    RuntimeConfig(warns_before_limit=True, preemption=Preemption(lead_time=0)).write(tmp_path / "runtime.json")
    env = {**launch_env(), "HPC_RUNTIME_CONFIG": str(tmp_path / "runtime.json"), "HPC_JOB_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning: preemption.lead_time is 0 s") == 1, proc.stderr
    measured = lead_time.read(tmp_path)
    assert measured is not None and 0.35 < measured.step_s < 5 and measured.save_s > 0
