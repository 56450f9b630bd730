#!/usr/bin/env python3
"""Submission latency on the on-machine SLURM cluster (scripts/slurm-local up).

    python scripts/bench/submit_latency.py [--runs 15] [--meet-runs 3]

1. `hpc submit` (to the printed job id, code snapshot included) against raw `sbatch --parsable` of the
   very script hpc rendered, interleaved in one run. Target: hpc at most raw + 150 ms. Also measured:
   the floor every Python CLI on click + jinja2 + yaml pays before doing anything, to split the overhead.
2. Time from the start of `hpc submit` until all ranks of a 2-node x 2-process job have met
   (torch.distributed.init_process_group over gloo returned on every rank).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MEET = """
import os, time, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
open(os.path.join(os.environ["MEET_DIR"], "rank%s" % os.environ["RANK"]), "w").write(repr(time.time()))
dist.destroy_process_group()
"""


def hpc(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("hpc")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "hpc"]
    return subprocess.run([*argv, *args], cwd=cwd, env=env, capture_output=True, text=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--meet-runs", type=int, default=3)
    opts = ap.parse_args()
    up = subprocess.run([str(REPO / "scripts" / "slurm-local"), "up"], capture_output=True, text=True)
    if up.returncode != 0:
        sys.exit(f"scripts/slurm-local up failed: {up.stderr or up.stdout}")
    conf = subprocess.run([str(REPO / "scripts" / "slurm-local"), "env"], capture_output=True, text=True).stdout
    work = Path(tempfile.mkdtemp(prefix="hpc-bench-submit-"))
    env = {**os.environ, "SLURM_CONF": conf.split("=", 1)[1].strip(), "XDG_DATA_HOME": str(work / "data"),
           "XDG_CONFIG_HOME": str(work / "config"), "MEET_DIR": str(work / "meet")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    (work / "noop.py").write_text("pass\n")
    (work / "meet.py").write_text(MEET)
    args = ["submit", "--json", "-p", "slurm-local", "--ntasks-per-node", "1", "noop.py"]
    first = hpc(*args, cwd=work, env=env)
    if first.returncode != 0:
        sys.exit(first.stderr)
    script = Path(json.loads(first.stdout)["job_dir"]) / "job.sbatch"
    ids, hpc_times, raw_times, floor_times = [], [], [], []
    for i in range(opts.runs):
        print(f"\rsubmit {i + 1}/{opts.runs}", end="", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        proc = hpc(*args, cwd=work, env=env)
        hpc_times.append(time.perf_counter() - t0)
        ids.append(json.loads(proc.stdout)["job_id"])
        t0 = time.perf_counter()
        raw = subprocess.run(["sbatch", "--parsable", f"--chdir={work}", str(script)], env=env,
                             capture_output=True, text=True)
        raw_times.append(time.perf_counter() - t0)
        ids.append(raw.stdout.strip())
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import click, jinja2, yaml"], env=env)
        floor_times.append(time.perf_counter() - t0)
    subprocess.run(["scancel", *ids], env=env, capture_output=True)
    meet_times = []
    for i in range(opts.meet_runs):
        print(f"\rmeet {i + 1}/{opts.meet_runs}      ", end="", file=sys.stderr, flush=True)
        (work / "meet").mkdir(exist_ok=True)
        for f in (work / "meet").iterdir():
            f.unlink()
        t0 = time.time()
        proc = hpc("submit", "--wait", "-p", "slurm-local", "-N", "2", "meet.py", cwd=work, env=env)
        if proc.returncode != 0:
            sys.exit(f"2-node job failed: {proc.stderr}")
        met = [float(f.read_text()) for f in (work / "meet").iterdir()]
        assert len(met) == 4, met
        meet_times.append(max(met) - t0)
    print("\r", end="", file=sys.stderr)
    h, r, f = statistics.median(hpc_times), statistics.median(raw_times), statistics.median(floor_times)
    print(f"{'measure':44}  median_s  min_s   max_s")
    print(f"{'raw sbatch --parsable (same script)':44}  {r:8.3f}  {min(raw_times):6.3f}  {max(raw_times):6.3f}")
    print(f"{'hpc submit (render, snapshot, record)':44}  {h:8.3f}  {min(hpc_times):6.3f}  {max(hpc_times):6.3f}")
    floor_label = "python -c 'import click, jinja2, yaml'"
    print(f"{floor_label:44}  {f:8.3f}  {min(floor_times):6.3f}  {max(floor_times):6.3f}")
    print(f"{'hpc overhead over raw (target <= 0.150)':44}  {h - r:8.3f}")
    print(f"{'  of which the import floor':44}  {f:8.3f}")
    print(f"{'  of which hpc itself (modules + work)':44}  {h - r - f:8.3f}")
    print(f"{'submit -> all 4 ranks met (2 nodes, torch)':44}  {statistics.median(meet_times):8.3f}  "
          f"{min(meet_times):6.3f}  {max(meet_times):6.3f}")
    print(f"({opts.runs} submissions each, interleaved; {opts.meet_runs} rendezvous runs)")


if __name__ == "__main__":
    main()
