#!/usr/bin/env python3
"""`hpc status` of a 10,000-task array and `hpc list -n 200`, against recorded squeue/sacct output of that size.

    python scripts/bench/status_scale.py [--runs 5] [--tasks 10000] [--jobs 200]

SLURM's commands are stand-ins on PATH that print the recorded output and count their calls, so the figures
are hpc's own cost (the whole CLI, Python start included) and the number of SLURM calls it makes.
Target: each under 1 s, at most two SLURM calls (squeue + sacct; `scontrol show config` once per cluster,
remembered, is shown on the cold line).
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
sys.path.insert(0, str(REPO))

STUB = """#!/bin/bash
echo "$(basename "$0") $*" >> {calls}
case "$(basename "$0")" in
  squeue) cat {out}/squeue.txt ;;
  sacct) cat {out}/sacct.txt ;;
  scontrol) echo "AccountingStorageType   = accounting_storage/slurmdbd" ;;
esac
"""


def _record(data: Path, folder: Path, job_id: str, array: list[int] | None, when: float) -> None:
    from hpc.cluster import records as jobs
    from hpc.contract import layout

    (folder / layout.TASKS).mkdir(parents=True)
    rec = jobs.JobRecord(job_id=job_id, scheduler="slurm", profile="bench", name="train", job_dir=str(folder),
                         submitted_at=when, argv=[], workdir=str(folder), script="job.sbatch", array=array)
    jobs.save(rec)


def build(work: Path, tasks: int, n_jobs: int) -> dict:
    """Job records and the recorded squeue/sacct lines: a quarter of each array still queued, the rest ended."""
    os.environ["XDG_DATA_HOME"] = str(work / "data")
    start = time.time() - 3600
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start + 60))
    squeue, sacct = [], []
    big = "900000"
    _record(work, work / "jobs" / "big", big, list(range(tasks)), start)
    for t in range(tasks):
        raw = 900001 + t
        if t < tasks // 4:
            squeue.append(f"{big}_{t}|{'RUNNING' if t < 64 else 'PENDING'}|{raw}|None")
        else:
            sacct.append(f"{big}_{t}|{raw}|{'COMPLETED' if t % 50 else 'FAILED'}|{0 if t % 50 else 1}:0|{stamp}")
    for j in range(n_jobs - 1):
        job_id = str(800000 + j)
        array = list(range(8)) if j % 5 == 0 else None
        _record(work, work / "jobs" / f"j{j}", job_id, array, start + j)
        for task in (array or [None]):
            ident = job_id if task is None else f"{job_id}_{task}"
            if j % 4 == 0:
                squeue.append(f"{ident}|RUNNING|{job_id}|None")
            else:
                sacct.append(f"{ident}|{job_id}|COMPLETED|0:0|{stamp}")
    out = work / "recorded"
    out.mkdir()
    (out / "squeue.txt").write_text("\n".join(squeue) + "\n")
    (out / "sacct.txt").write_text("\n".join(sacct) + "\n")
    stubs = work / "bin"
    stubs.mkdir()
    for name in ("squeue", "sacct", "scontrol"):
        (stubs / name).write_text(STUB.format(calls=work / "calls.txt", out=out))
        (stubs / name).chmod(0o755)
    (work / "slurm.conf").write_text("# recorded: no controller\n")
    return {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_CONF": str(work / "slurm.conf"),
            "XDG_CACHE_HOME": str(work / "cache"), "XDG_DATA_HOME": str(work / "data")}


def run(env: dict, work: Path, *args: str) -> tuple[float, list[str], str]:
    calls = work / "calls.txt"
    calls.write_text("")
    exe = Path(sys.executable).with_name("hpc")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "hpc"]
    t0 = time.perf_counter()
    proc = subprocess.run([*argv, *args], env=env, capture_output=True, text=True, cwd=work)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"hpc {' '.join(args)} failed: {proc.stderr}")
    return took, [line.split()[0] for line in calls.read_text().splitlines()], proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--jobs", type=int, default=200)
    opts = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpc-bench-status-"))
    env = build(work, opts.tasks, opts.jobs)
    cases = [(f"hpc status (array of {opts.tasks})", ["status", "--json", "900000"]),
             (f"hpc list -n {opts.jobs}", ["list", "--json", "-n", str(opts.jobs)])]
    rows = []
    cold, calls, _ = run(env, work, *cases[0][1])
    rows.append(("first command (asks scontrol once)", cold, "+".join(calls)))
    for label, args in cases:
        times = []
        for _ in range(opts.runs):
            took, calls, out = run(env, work, *args)
            times.append(took)
        shown = json.loads(out)
        check = (shown["counts"] if isinstance(shown, dict) else len(shown))
        rows.append((label, statistics.median(times), "+".join(calls) + f"  ({check})"))
    print(f"{'command':<40} {'median s':>9}  SLURM calls")
    for label, took, calls in rows:
        print(f"{label:<40} {took:>9.3f}  {calls}")


if __name__ == "__main__":
    main()
