#!/usr/bin/env python3
"""What vetting costs a job: measured on the on-machine SLURM for 2 and 3 nodes, and modelled for 512.

    scripts/slurm-local up && export SLURM_CONF=/tmp/hpc-slurm/etc/slurm.conf
    python scripts/bench/vetting.py [--nodes 2 3] [--repeat 2]

For each node count it submits scripts/examples/hello_ranks.py with --vet (one rank per node) and reads back:
  vetting   what the batch script printed ("hpc: vetting took N s"): the probe step (srun, Python with torch, the
            checks, the process group, compute and link tests) and the verdict, start to end
  checks    the slowest node's own checks (health_check lines, memory, disk, GPUs)
  network   the slowest node's compute test, rendezvous, link rounds and all-reduce
  verdict   `python -m hpc.runtime.vetting.select` on its own (a torch-free process)
The rest of `vetting` is the srun step's start and Python importing torch on every node at once.

Then the 512-node model: the verdict timed on 512 synthetic reports (that part runs here, as it does in the
batch shell), and the probe's parts priced from their own rules (see the printout).
"""

from __future__ import annotations

import argparse
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
HELLO = ROOT / "scripts" / "examples" / "hello_ranks.py"


def hpc(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc", *args], cwd=folder, capture_output=True, text=True,
                          timeout=600)


def one_job(folder: Path, nodes: int) -> dict:
    proc = hpc(folder, "submit", "--json", "-p", "slurm-local", "-N", str(nodes), "--nproc", "1", "--set",
               "vet=true", "hello_ranks.py")
    if proc.returncode != 0:
        raise SystemExit(f"the submit failed: {proc.stderr}")
    info = json.loads(proc.stdout)
    if hpc(folder, "wait", info["job_id"]).returncode != 0:
        raise SystemExit(f"job {info['job_id']} failed: see {info['job_dir']}/logs")
    logs = hpc(folder, "logs", "--all", info["job_id"]).stdout
    took = re.search(r"vetting took (\d+) s", logs)
    reports = [json.loads(p.read_text()) for p in Path(info["job_dir"]).glob("vetting/0/0/*.json")]
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hpc.runtime.vetting.select", str(Path(info["job_dir"]) / "vetting/0/0"),
                    str(nodes), *[r["host"] for r in reports]], capture_output=True, check=True)
    return {"vetting": float(took.group(1)) if took else float("nan"),
            "checks": max(r["seconds"]["checks"] for r in reports),
            "network": max(r["seconds"].get("network", float("nan")) for r in reports),
            "verdict": time.perf_counter() - started}


def verdict_at_scale(nodes: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        hosts = [f"gpu{i:04d}" for i in range(nodes)]
        for i, host in enumerate(hosts):
            report = {"host": host, "checks": [{"name": "free memory", "ok": True, "detail": ""}],
                      "compute_gflops": 300000.0 - i, "links_gbps": {str((i + k) % nodes): 45.0 for k in (1, 2, 3)}}
            (folder / f"{host}.json").write_text(json.dumps(report))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_")}
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hpc.runtime.vetting.select", str(folder), str(nodes - 8), *hosts],
                       capture_output=True, check=True, env=env)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hpc-bench-vetting-") as tmp:
        folder = Path(tmp)
        shutil.copy(HELLO, folder)
        for nodes in args.nodes:
            runs = [one_job(folder, nodes) for _ in range(args.repeat)]
            rows.append((nodes, {k: statistics.median(r[k] for r in runs) for k in runs[0]}))
    print(f"{'nodes':>5} | {'vetting s':>9} | {'checks s':>8} | {'network s':>9} | {'verdict s':>9}")
    print("------|-----------|----------|-----------|----------")
    for nodes, r in rows:
        print(f"{nodes:>5} | {r['vetting']:>9.0f} | {r['checks']:>8.2f} | {r['network']:>9.2f} | {r['verdict']:>9.2f}")
    print(f"\n512 nodes: the verdict on 512 reports takes {verdict_at_scale(512):.2f} s here (one process, "
          "one file read per node).")
    print("The probe's parts at 512 nodes, from their rules: the node's own checks do not grow with the job; the "
          "rendezvous is one TCPStore that 512 ranks join (c10d's, seconds at this size); the link test is 3 "
          "rounds of disjoint pairs, each pair moving 256 MB both ways at once (about 10 ms at 25 GB/s per "
          "direction, whatever the node count) plus a barrier per round; the all-reduce of 256 MB moves "
          "2 x 511/512 of it through each node (about 20 ms at 25 GB/s) plus ring latency (512 x ~10 us). What "
          "dominates is starting Python with torch on 512 nodes from a shared filesystem (tens of seconds on a "
          "busy Lustre; the job pays it again for its ranks) and NCCL's communicator setup (seconds). On paper: "
          "30-60 s per attempt at 512 nodes, against a requeue that costs the queue wait and a restart.")


if __name__ == "__main__":
    main()
