#!/usr/bin/env python3
"""How long the login-node CLI takes to start, against the floor of importing its own dependencies.

    python scripts/bench/cli_startup.py [--runs 21]

Runs, interleaved in one session: `python -c "import click, jinja2, yaml"` (the floor), `hpc --help`,
and `hpc render` of a 1,024-node DeepSpeed job (script + 1,024-line hostfile). Prints median wall times,
and the ratio to the floor (target: at most 1.3).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def hpc_argv() -> list[str]:
    exe = Path(sys.executable).with_name("hpc")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "hpc"]


def timed(argv: list[str], cwd: str, env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed: {proc.stderr.decode()[-500:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21)
    opts = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hpc-bench-")
    Path(work, "cluster_configs").mkdir()
    Path(work, "cluster_configs", "big.yaml").write_text("extends: perlmutter\nname: big\nmax_nodes: 4096\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(Path(work, "xdg"))}
    # as on a user's machine: modules byte-compiled once (pip does it at install), templates cached after one run
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cases = {
        "floor: import click, jinja2, yaml": [sys.executable, "-c", "import click, jinja2, yaml"],
        "hpc --help": [*hpc_argv(), "--help"],
        "hpc render (1,024 nodes)": [*hpc_argv(), "render", "-p", "big", "-N", "1024", "-w", "nid[000001-001024]",
                                     "--launcher", "deepspeed", "train.py", "--", "--lr", "3e-4"],
    }
    for argv in cases.values():  # warm the page cache and __pycache__
        timed(argv, work, env)
    walls: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(opts.runs):
        print(f"\rrun {i + 1}/{opts.runs}", end="", file=sys.stderr, flush=True)
        for name, argv in cases.items():
            walls[name].append(timed(argv, work, env))
    print("\r", end="", file=sys.stderr)
    floor = statistics.median(walls["floor: import click, jinja2, yaml"])
    rows = [(name, statistics.median(w), statistics.median(w) / floor, min(w), max(w)) for name, w in walls.items()]
    width = max(len(r[0]) for r in rows)
    print(f"{'command'.ljust(width)}  median_s  x_floor  min_s   max_s")
    for name, med, ratio, lo, hi in rows:
        print(f"{name.ljust(width)}  {med:8.3f}  {ratio:7.2f}  {lo:6.3f}  {hi:6.3f}")
    print(f"({opts.runs} runs each, interleaved; target: hpc at most 1.30 x floor)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
