"""With auto_resume, reading a property on one rank runs no collective: `if is_main_process:
print(acc.completed_steps)` followed by a collective used to pair rank 0's resume with the others' barrier."""

import json
import os
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent("""
    import json, sys
    import torch
    from hpc import Accelerator

    acc = Accelerator(project_dir="proj", auto_resume=True)
    with acc.main_process_first():  # loading data before prepare(): no resume yet, there is nothing to restore
        pass
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    seen = None
    if acc.is_main_process:
        seen = acc.completed_steps  # rank 0 alone: must not start the resume's collectives
        if sys.argv[1] == "report":  # rank 1 has already gone: a collective on rank 0 would wait for it
            json.dump({"seen": seen}, open(sys.argv[2], "w"))
    if sys.argv[1] == "report":
        sys.exit(0)
    acc.wait_for_everyone()  # the resume happens here, on every rank together
    while acc.completed_steps < int(sys.argv[1]):
        acc.backward(model(torch.ones(2, 3) * (acc.completed_steps + 1)).pow(2).sum())
        opt.step()
        opt.zero_grad()
        if acc.completed_steps == 3:
            acc.save_state()
    weights = acc.gather(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).reshape(1, -1))
    if acc.is_main_process:
        json.dump({"seen": seen, "steps": acc.completed_steps, "weights": weights[0].tolist()},
                  open(sys.argv[2], "w"))
""")


def _run(tmp_path, steps, out):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "ACCELERATE_"))}
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", "worker.py", str(steps), out],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / out).read_text())


def test_reading_completed_steps_on_one_rank_before_the_resume_neither_hangs_nor_skips_it(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    straight = _run(tmp_path, 5, "straight.json")  # saves at step 3 on the way
    assert (straight["seen"], straight["steps"]) == (0, 5)
    assert _run(tmp_path, "report", "report.json") == {"seen": 3}
    resumed = _run(tmp_path, 5, "resumed.json")  # starts again from the step-3 checkpoint
    assert resumed["seen"] == 3 and resumed["steps"] == 5
    assert resumed["weights"] == straight["weights"]
