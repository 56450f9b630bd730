#!/usr/bin/env python3
"""What `hpc status` costs over SSH: against one SSH round trip and against the same command on the login node.

    SLURM_LOCAL_SSH=1 scripts/slurm-local up && python scripts/bench/remote_status.py [--runs 11]

Submits one small job through the built-in profile slurm-local-ssh (the on-machine cluster's login node,
127.0.0.1:2222) and one through slurm-local (no SSH), waits for both, then times, interleaved:
  - `ssh ... true` over hpc's master connection: one round trip (the login shell's start-up included);
  - `hpc status` of the SSH job, from a shell without SLURM's configuration;
  - `hpc status` of the direct job, on this machine (the same decision, SLURM asked directly).
Target: the SSH status costs at most one round trip plus 100 ms more than the direct one.
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


def hpc(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("hpc")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "hpc"]
    return subprocess.run([*argv, *args], env=env, cwd=cwd, capture_output=True, text=True)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=11)
    opts = ap.parse_args()
    up = subprocess.run([str(REPO / "scripts" / "slurm-local"), "up"], env={**os.environ, "SLURM_LOCAL_SSH": "1"},
                        capture_output=True, text=True)
    if up.returncode != 0:
        sys.exit(f"scripts/slurm-local up failed: {up.stderr or up.stdout}")
    conf = subprocess.run([str(REPO / "scripts" / "slurm-local"), "env"], capture_output=True,
                          text=True).stdout.split("=", 1)[1].strip()
    work = Path(tempfile.mkdtemp(prefix="hpc-bench-remote-"))
    (work / "noop.py").write_text("pass\n")
    base = {**os.environ, "XDG_DATA_HOME": str(work / "data"), "XDG_CACHE_HOME": str(work / "cache")}
    remote_env = {k: v for k, v in base.items() if k != "SLURM_CONF"}
    local_env = {**base, "SLURM_CONF": conf}
    ids = {}
    for name, profile, env in (("ssh", "slurm-local-ssh", remote_env), ("direct", "slurm-local", local_env)):
        proc = hpc("submit", "--json", "-p", profile, "--ntasks-per-node", "1", "noop.py", env=env, cwd=work)
        if proc.returncode != 0:
            sys.exit(proc.stderr)
        ids[name] = json.loads(proc.stdout)["job_id"]
        hpc("wait", ids[name], env=env, cwd=work)

    from hpc.cluster.config import precedence
    from hpc.cluster.ssh import Ssh

    remote = precedence.resolve("slurm-local-ssh", [precedence.flag_layer({"script": "noop.py"})]).profile.remote
    trip = Ssh(remote).command_line("true")
    cases = {"ssh round trip (ssh ... true)": lambda: subprocess.run(trip, capture_output=True, env=remote_env),
             "hpc status over SSH": lambda: hpc("status", ids["ssh"], env=remote_env, cwd=work),
             "hpc status on the login node": lambda: hpc("status", ids["direct"], env=local_env, cwd=work)}
    for fn in cases.values():  # warm: the master connection, the accounting source, the bytecode
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(opts.runs):
        for name, fn in cases.items():
            times[name].append(timed(fn))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{'command':<34} {'median s':>9}")
    for name, value in med.items():
        print(f"{name:<34} {value:>9.3f}")
    extra = med["hpc status over SSH"] - med["hpc status on the login node"] - med["ssh round trip (ssh ... true)"]
    print(f"SSH status - direct status - one round trip: {extra * 1000:+.0f} ms (target <= +100 ms)")


if __name__ == "__main__":
    main()
