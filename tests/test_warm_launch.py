"""hpc's torchrun agent (python -m hpc.runtime.launch.warm_launch) forks its workers from itself: each still runs
the script as `python -u script.py` would. One real run of two workers."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
import atexit, json, os, sys
import torch
from helper import NAME  # the script's own folder comes first on sys.path
rank = os.environ["RANK"]
atexit.register(lambda: open(f"exit-{rank}", "w").write("ran"))
json.dump({"argv": sys.argv[1:], "name": __name__, "helper": NAME, "threads": torch.get_num_threads(),
           "file": os.path.basename(__file__)}, open(f"rank-{rank}.json", "w"))
"""


def test_forked_workers_run_the_script_as_python_would(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "job.py").write_text(SCRIPT)
    (tmp_path / "code" / "helper.py").write_text("NAME = 'beside the script'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_", "SLURM_", "RANK", "MASTER_"))}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "hpc.runtime.launch.warm_launch", "--standalone",
                           "--nproc_per_node=2", "code/job.py", "--lr", "it's $HOME"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "start_method: fork" not in proc.stderr  # no worker failed
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        # torchrun's OMP_NUM_THREADS=1 for 2 processes holds, though the agent read torch's thread count first
        assert seen == {"argv": ["--lr", "it's $HOME"], "name": "__main__", "helper": "beside the script",
                        "threads": 1, "file": "job.py"}
        assert (tmp_path / f"exit-{rank}").read_text() == "ran"  # atexit handlers: forked workers skip them else
