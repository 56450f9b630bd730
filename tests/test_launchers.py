"""notebook_launcher and debug_launcher: a function (not a script) run by several forked processes."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, os, sys
    from hpc import Accelerator, debug_launcher, notebook_launcher

    out = sys.argv[1]

    def train(tag):  # defined here, as in a notebook cell: never imported by the children
        import torch
        acc = Accelerator()
        total = acc.reduce(torch.tensor([float(acc.process_index + 1)]), "sum").item()
        with open(f"{out}/{tag}-{acc.process_index}.json", "w") as f:
            json.dump({"world": acc.num_processes, "sum": total, "precision": acc.mixed_precision,
                       "device": acc.device.type}, f)
        acc.end_training()

    debug_launcher(train, args=("debug",), num_processes=2)
    notebook_launcher(train, args=("notebook",), num_processes=2, mixed_precision="bf16", use_port=29531)
    try:
        def fail():
            raise ValueError("boom")
        debug_launcher(fail, num_processes=2)
    except Exception as e:
        print("error:", e)
""")


def test_launchers_run_a_function_on_two_processes(tmp_path):
    import json

    (tmp_path / "run.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "ACCELERATE_"))}
    proc = subprocess.run([sys.executable, "run.py", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*-*.json")}
    assert runs == {
        "debug-0": {"world": 2, "sum": 3.0, "precision": "no", "device": "cpu"},
        "debug-1": {"world": 2, "sum": 3.0, "precision": "no", "device": "cpu"},
        "notebook-0": {"world": 2, "sum": 3.0, "precision": "bf16", "device": "cpu"},
        "notebook-1": {"world": 2, "sum": 3.0, "precision": "bf16", "device": "cpu"},
    }
    assert "error: a launched process failed: ValueError: boom" in proc.stdout
