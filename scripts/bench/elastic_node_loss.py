#!/usr/bin/env python3
"""Seconds from a node's death to training again: an elastic torchrun job on the on-machine SLURM loses its second
node mid-run; its survivor goes on alone, or with a hot spare in the lost node's place (--spare-nodes 1).

    scripts/slurm-local up && export SLURM_CONF=/tmp/hpc-slurm/etc/slurm.conf
    python scripts/bench/elastic_node_loss.py [--repeat 5] [--how kill-tasks kill-node] [--spare-nodes 1]
    python scripts/bench/elastic_node_loss.py --launcher srun --how kill-node --spare-nodes 1 [--fast-tier]

Each run submits tests/elastic_worker.py (--elastic 1:2, one process a node, a checkpoint every 5 steps by the
script's save_state, 0.2 s a step until the node goes), kills the second node once step 6 is done
(`scripts/slurm-local kill-tasks` kills its job processes, its slurmd lives on; `kill-node` kills the node whole),
then reads back (KEEP=folder keeps each job folder):
  failed     the survivor's agent saw its process fail (the agent log's "failed (exitcode" line; its peer's
             connection closed: on one machine at once, across real nodes when the kernel says so or gloo/NCCL's
             timeout ends)
  spawned    the next round's rank 0 process began (the timeline's `started` proc_start): the rendezvous is done
  ready      its `started` line: imports, the process group, the Accelerator
  trained    its first step, from the newest checkpoint (the worker's world-a0-r1 file)
  done       the job's end (COMPLETED), as `hpc wait` saw it
  redone     steps trained twice (the worker's own step log: the last step before the kill, less the step the
             next round resumed from)
All seconds from the kill. --fast-tier turns on the checkpoint tier in node memory (every step, a copy on the next
node). --launcher srun: a plain (not elastic) job of 2 nodes, one rank each; with --spare-nodes its job script puts
a spare in a lost node's place and runs the step again ("failed": the survivor's `ended` line, its exception). A
killed node is revived after its run.
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


def _first_round_of_two(run: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for world in run.glob("world-a0-r*"):
            try:
                if json.loads(world.read_text())["world"] >= 2:
                    return int(world.name.rsplit("r", 1)[1])
            except (OSError, ValueError):
                pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for a round of two nodes in {run}")


def _next_round(job_dir: str, killed: float) -> dict:
    """The first `started` line after the kill, and the `resumed` line after it (the job's timeline)."""
    events = [json.loads(line) for line in Path(job_dir, "tasks", "0.timeline").read_text().splitlines() if line]
    out = {}
    for event in events:
        if event["event"] == "started" and event["t"] > killed and "started" not in out:
            out["started"] = event
        elif event["event"] == "resumed" and "started" in out:
            out["resumed"] = event
            break
    return out


def _survivor_failed_at(job_dir: str, killed: float) -> float:
    """A plain job's survivor: its timeline's first `ended` line after the kill (the exception of a lost peer)."""
    for line in Path(job_dir, "tasks", "0.timeline").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "ended" and event["t"] > killed:
            return event["t"]
    return float("nan")


def one_run(folder: Path, how: str, spares: int = 0, sleep: float = 0.2, save_every: int = 5,
            fast_tier: bool = False, launcher: str = "torchrun") -> dict:
    shutil.copy(WORKER, folder)
    shutil.copy(WORKER.with_name("shape_worker.py"), folder)  # its sample log
    run = folder / "el"
    spec = {"project": str(run), "out": str(folder / "el.pt"), "epochs": 2, "save_every": save_every,
            "sleep": sleep, "sleep_until_killed": True}
    # spares are vetted nodes: vetting on (relative_speed 0: the nodes share this machine's CPUs)
    (folder / "bench.yaml").write_text("name: bench\nextends: slurm-local\n"
                                       + ("vetting:\n  enabled: true\n  relative_speed: 0\n" if spares else "")
                                       + ("fast_tier:\n  enabled: true\n" if fast_tier else ""))
    how_launched = ["--launcher", "torchrun", "--nproc", "1", "--elastic", "1:2", "--max-restarts", "3"] \
        if launcher == "torchrun" else ["--launcher", "srun", "-N", "2", "--ntasks-per-node", "1"]
    proc = hpc(folder, "submit", "--json", "-p", "bench.yaml", *how_launched, "--time", "5", "-J", "el",
               *(["--spare-nodes", str(spares)] if spares else []), "elastic_worker.py", "--", json.dumps(spec))
    if proc.returncode != 0:
        raise SystemExit(f"the submit failed: {proc.stderr}")
    info = json.loads(proc.stdout)
    base = _first_round_of_two(run, 300)  # a round that started with one node (a late agent) grows to two first
    victim = json.loads((run / f"world-a0-r{base}").read_text())["hosts"][1]
    while int((run / "progress").read_text()) < save_every + 1:  # past the first checkpoint
        time.sleep(0.05)
    killed = time.time()
    subprocess.run([str(SLURM_LOCAL), how, victim], check=True, capture_output=True)
    (run / "killed").write_text(str(killed))
    try:
        waited = hpc(folder, "wait", info["job_id"])
        done = time.time()
        if KEEP:
            shutil.copytree(info["job_dir"], KEEP / Path(info["job_dir"]).name, dirs_exist_ok=True)
        if waited.returncode != 0:
            raise SystemExit(f"job {info['job_id']} did not complete: see {info['job_dir']}/logs")
        # the first round after the kill (named by rank 0's agent's restart count: 0 again where rank 0 is a spare's)
        worlds = sorted((json.loads(p.read_text()) for p in run.glob("world-a0-r*")), key=lambda w: w["trained_at"])
        after = next((w for w in worlds if w["trained_at"] > killed), None)
        if after is None:
            print(f"no round began after the kill (rounds: {worlds}); run left out", file=sys.stderr)
            return None
        rows = [(int(line.split()[1]), float(line.split()[2])) for line in (run / "steps").read_text().splitlines()]
        # the new round's first step line (its world file is written just after it), and the line before it
        first = max(i for i, (s, t) in enumerate(rows) if s == after["step"] and t <= after["trained_at"])
        logs = "".join(p.read_text(errors="replace") for p in Path(info["job_dir"], "logs").glob("node*"))
        nxt = _next_round(info["job_dir"], killed)
        failed = _agent_failed_at(logs, killed) if launcher == "torchrun" else \
            _survivor_failed_at(info["job_dir"], killed)
        return {"failed": failed - killed,
                "spawned": nxt["started"]["proc_start"] - killed if "started" in nxt else float("nan"),
                "ready": nxt["started"]["t"] - killed if "started" in nxt else float("nan"),
                "trained": after["trained_at"] - killed, "done": done - killed,
                "redone": rows[first - 1][0] - (after["step"] - 1),
                "world": after["world"], "hosts": ",".join(after["hosts"]), "victim": victim}
    finally:
        if how == "kill-node":
            subprocess.run([str(SLURM_LOCAL), "revive-node", victim], capture_output=True, timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--how", nargs="+", default=["kill-tasks", "kill-node"])
    parser.add_argument("--spare-nodes", type=int, default=0, help="hot spares (3 nodes: 1)")
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds a step until the node goes")
    parser.add_argument("--save-every", type=int, default=5, help="a checkpoint every N steps")
    parser.add_argument("--fast-tier", action="store_true", help="checkpoints in node memory every step too")
    parser.add_argument("--launcher", choices=["torchrun", "srun"], default="torchrun",
                        help="torchrun: an elastic job (1:2); srun: a plain job of 2 nodes")
    args = parser.parse_args()
    rows = []
    for how in args.how:
        runs = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
                one = one_run(Path(tmp), how, args.spare_nodes, args.sleep, args.save_every, args.fast_tier,
                              args.launcher)
                if one is not None:
                    runs.append(one)
                    print(json.dumps(one), file=sys.stderr)
        rows.append((how, runs))
    keys = ("failed", "spawned", "ready", "trained", "done", "redone")
    tier = ", fast tier" if args.fast_tier else ""
    print(f"| node loss ({args.launcher}, {args.repeat} runs, {args.spare_nodes} spare(s){tier}; median [min-max] s "
          "after the kill) | "
          + " | ".join(keys) + " | world after |")
    print("|---|" + "---|" * (len(keys) + 1))
    for how, runs in rows:
        cells = []
        for key in keys:
            values = [r[key] for r in runs]
            fmt = "g" if key == "redone" else ".1f"
            cells.append(f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]")
        worlds = ", ".join(sorted({str(r["world"]) for r in runs}))
        print(f"| {how} ({len(runs)} runs) | " + " | ".join(cells) + f" | {worlds} |")


if __name__ == "__main__":
    main()
