#!/usr/bin/env python3
"""Seconds from a node's death to training again at the smaller world: an elastic torchrun job on the on-machine
SLURM loses its second node mid-run and its survivor goes on alone.

    scripts/slurm-local up && export SLURM_CONF=/tmp/hpc-slurm/etc/slurm.conf
    python scripts/bench/elastic_node_loss.py [--repeat 2] [--how kill-tasks kill-node]

Each run submits tests/elastic_worker.py (--elastic 1:2, one process a node, a checkpoint every 2 steps, 0.5 s a
step until the node goes), kills the second node at step 3 (`scripts/slurm-local kill-tasks` kills its job
processes, its slurmd lives on; `kill-node` kills the node whole), then reads back:
  failed     the survivor's agent saw its process fail (the agent log's "failed (exitcode" line; its peer's
             connection closed: on one machine at once, across real nodes when the kernel says so or gloo/NCCL's
             timeout ends)
  trained    the survivor's first step at world 1, from the newest checkpoint (the worker's world-a0-r1 file)
  done       the job's end (COMPLETED), as `hpc wait` saw it
All seconds from the kill. A killed node is revived after its run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "elastic_worker.py"
SLURM_LOCAL = ROOT / "scripts" / "slurm-local"
KEEP = Path(os.environ["KEEP"]) if os.environ.get("KEEP") else None  # keep each run's job folder there


def hpc(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc", *args], cwd=folder, capture_output=True, text=True,
                          timeout=timeout)


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.2)


def _agent_failed_at(log: str, after: float) -> float:
    """The first "failed (exitcode" of torchrun's agent after `after`, from its glog-style prefix (E1128
    08:45:51.756000: month, day, local time; the year is this one)."""
    year = datetime.date.today().year
    for m in re.finditer(r"^E(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+) .*failed \(exitcode", log, re.M):
        at = datetime.datetime.strptime(f"{year}-{m[1]}-{m[2]} {m[3]}", "%Y-%m-%d %H:%M:%S.%f").timestamp()
        if at >= after - 1:
            return at
    return float("nan")


def one_run(folder: Path, how: str) -> dict:
    shutil.copy(WORKER, folder)
    shutil.copy(WORKER.with_name("shape_worker.py"), folder)  # its sample log
    run = folder / "el"
    spec = {"project": str(run), "out": str(folder / "el.pt"), "epochs": 2, "save_every": 2, "sleep": 0.5}
    proc = hpc(folder, "submit", "--json", "-p", "slurm-local", "--launcher", "torchrun", "--nproc", "1",
               "--elastic", "1:2", "--max-restarts", "3", "--time", "5", "-J", "el", "elastic_worker.py", "--",
               json.dumps(spec))
    if proc.returncode != 0:
        raise SystemExit(f"the submit failed: {proc.stderr}")
    info = json.loads(proc.stdout)
    _wait_for(run / "world-a0-r0", 300)
    victim = json.loads((run / "world-a0-r0").read_text())["hosts"][1]
    while int((run / "progress").read_text()) < 3:
        time.sleep(0.1)
    killed = time.time()
    subprocess.run([str(SLURM_LOCAL), how, victim], check=True, capture_output=True)
    try:
        waited = hpc(folder, "wait", info["job_id"])
        done = time.time()
        if KEEP:
            shutil.copytree(info["job_dir"], KEEP / Path(info["job_dir"]).name, dirs_exist_ok=True)
        if waited.returncode != 0:
            raise SystemExit(f"job {info['job_id']} did not complete: see {info['job_dir']}/logs")
        after = json.loads((run / "world-a0-r1").read_text())
        logs = "".join(p.read_text(errors="replace") for p in Path(info["job_dir"], "logs").glob("node*"))
        if KEEP:
            shutil.copytree(info["job_dir"], KEEP / Path(info["job_dir"]).name, dirs_exist_ok=True)
            shutil.copytree(run, KEEP / (Path(info["job_dir"]).name + "-run"), dirs_exist_ok=True)
            (KEEP / (Path(info["job_dir"]).name + "-killed")).write_text(str(killed))
        return {"failed": _agent_failed_at(logs, killed) - killed, "trained": after["trained_at"] - killed,
                "done": done - killed}
    finally:
        if how == "kill-node":
            subprocess.run([str(SLURM_LOCAL), "revive-node", victim], capture_output=True, timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--how", nargs="+", default=["kill-tasks", "kill-node"])
    args = parser.parse_args()
    rows = []
    for how in args.how:
        runs = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
                runs.append(one_run(Path(tmp), how))
        rows.append((how, runs))
    print(f"| node loss ({args.repeat} runs, median [min-max] s after the kill) | failed | trained at world 1 | "
          "done |")
    print("|---|---|---|---|")
    for how, runs in rows:
        cells = []
        for key in ("failed", "trained", "done"):
            values = [r[key] for r in runs]
            cells.append(f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]")
        print(f"| {how} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
