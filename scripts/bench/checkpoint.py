#!/usr/bin/env python3
"""Checkpoint cost: hpc's save_state/load_state against raw torch.save/torch.load and dcp.save/dcp.load.

    python scripts/bench/checkpoint.py [--gib 1.0] [--repeat 3] [--crash-trials 50] [--signal]

One process, a model plus its AdamW state of about --gib GiB in all (on --device), saved to the local disk (page
cache warm, as checkpoints usually are). Rows: raw baselines, hpc sync save (manifest with CRC-32 of every byte, commit
by rename), hpc async save (the training stall = the time save_state returns; then until commit), load
(checksums verified first). --crash-trials SIGKILLs a saving process at random moments and checks that the
newest committed checkpoint always verifies. --signal (needs scripts/slurm-local) times each kind of
interruption (the warning signal, preemption with and without a grace time, a lost node) until training runs
again. Medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hpc.cli.output import table  # noqa: E402


def timed(fn) -> float:
    os.sync()  # start clean: dirty pages left by the previous row would throttle this one's writes
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def build(acc, gib: float):
    """A model and its AdamW state (prepared: on the accelerator's device), about `gib` GiB in all."""
    import torch

    # AdamW holds two more copies of the parameters: parameters are a third of the state
    width = 2048
    layers = max(1, round(gib * 2**30 / 4 / 3 / width**2))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    nbytes = sum(p.numel() * 4 * 3 for p in model.parameters())
    return model, opt, nbytes


def drop(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def bench_io(gib: float, repeat: int, work: Path, device: str) -> tuple[list[list], int]:
    import warnings

    warnings.filterwarnings("ignore")  # dcp without a process group warns on every call
    import torch
    import torch.distributed.checkpoint as dcp

    from hpc import Accelerator

    acc = Accelerator(project_dir=work / "project", cpu=device == "cpu")
    model, opt, nbytes = build(acc, gib)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    times: dict[str, list[float]] = {k: [] for k in ("raw save", "raw load", "dcp save", "dcp load", "hpc save",
                                                      "hpc load", "hpc async stall", "hpc async to commit",
                                                      "hpc one-pass read")}
    host: dict = {}
    for i in range(repeat + 1):  # the first round warms up (threads, allocator, page cache) and is dropped
        if i == 1:
            times = {k: [] for k in times}
        raw = work / "raw.pt"
        times["raw save"].append(timed(lambda: torch.save(state, raw)))
        times["raw load"].append(timed(lambda: torch.load(raw, weights_only=True)))
        drop(raw)
        folder = work / "dcp"
        times["dcp save"].append(timed(lambda: dcp.save(state, checkpoint_id=str(folder), no_dist=True)))
        times["dcp load"].append(timed(lambda: dcp.load(state, checkpoint_id=str(folder), no_dist=True)))
        drop(folder)
        acc._completed_steps = 2 * i + 1
        times["hpc save"].append(timed(lambda: acc.save_state()))
        times["hpc load"].append(timed(lambda: acc.load_state()))
        times["hpc one-pass read"].append(timed(lambda: one_pass_read(acc, device, host)))
        drop(acc.checkpoint_dir)  # every row writes into the same clean page cache
        acc._completed_steps = 2 * i + 2
        os.sync()
        start = time.perf_counter()
        acc.save_state(async_save=True)
        times["hpc async stall"].append(time.perf_counter() - start)
        acc.wait_for_checkpoint()
        times["hpc async to commit"].append(time.perf_counter() - start)
        drop(acc.checkpoint_dir)
    med = {k: statistics.median(v) for k, v in times.items()}
    gbs = nbytes / 2**30
    rows = []
    for name, base in [("raw save", None), ("dcp save", "raw save"), ("hpc save", "raw save"),
                       ("hpc async stall", "hpc save"), ("hpc async to commit", "hpc save"),
                       ("raw load", None), ("dcp load", "raw load"), ("hpc load", "raw load"),
                       ("hpc one-pass read", "raw load")]:
        rows.append([name, f"{med[name]:.3f}", f"{gbs / med[name]:.2f}",
                     f"{med[name] / med[base]:.2f}x {base}" if base else ""])
    rows.append(["", "", "", ""])
    rows.append(["host side of one-pass read", f"{host['copied'] / 2**30:.2f} GiB copied in {host['chunks']} chunks "
                 f"({host['storages']} storages), {host['crc'] / 2**30:.2f} GiB checksummed beside", "", ""])
    return rows, nbytes


def one_pass_read(acc, device: str, host: dict) -> None:
    """The state files of the newest checkpoint read onto `device` by device_load, each file's CRC verified on
    another thread in the same pass (what hpc load does after its separate verification pass, without it)."""
    from hpc.runtime.checkpoint import device_load, manifest
    from hpc.runtime.checkpoint.store import CheckpointStore

    folder = CheckpointStore(Path(acc.checkpoint_dir)).committed()[0].path
    files = manifest.read(folder)["files"]
    stats = device_load.LoadStats()
    for name in sorted(files):
        if name.startswith(("model_", "optimizer_")):
            device_load.load(folder / name, acc.device, expect=files[name], stats=stats)
    host.update(copied=stats.bytes_copied, chunks=stats.chunks, storages=stats.storages, crc=stats.crc_bytes)


def crash_trials(n: int, work: Path) -> list[list]:
    from hpc.runtime.checkpoint import manifest
    from hpc.runtime.checkpoint.store import CheckpointStore

    rng = random.Random(7)
    partial = bad = empty = 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    saver = subprocess.Popen([sys.executable, str(ROOT / "tests" / "crash_saver.py"), str(work / "crash"), "64"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    for trial in range(n):
        saver.stdin.write("go\n")
        saver.stdin.flush()
        pid = int(saver.stdout.readline().split()[1])
        time.sleep(rng.uniform(0.3, 2.0))
        os.kill(pid, signal.SIGKILL)
        project = work / "crash" / f"t{trial}"
        store = CheckpointStore(project / "checkpoints")
        partial += any(not e.committed for e in store.entries())
        committed = store.committed()
        if not committed:
            empty += 1
        elif manifest.verify(committed[0].path, committed[0].manifest["files"]) is not None:
            bad += 1
        shutil.rmtree(project, ignore_errors=True)
        if sys.stderr.isatty():
            print(f"\rcrash trials: {trial + 1}/{n}", end="", file=sys.stderr, flush=True)
        elif (trial + 1) % 10 == 0 or trial + 1 == n:
            print(f"crash trials: {trial + 1}/{n}", file=sys.stderr, flush=True)
    saver.stdin.close()
    saver.wait()
    if sys.stderr.isatty():
        print(file=sys.stderr)
    return [["SIGKILL trials", n], ["  killed inside a save (partial folder left)", partial],
            ["  no checkpoint committed yet", empty], ["  newest committed failed to verify", bad]]


SLURM_LOCAL = ROOT / "scripts" / "slurm-local"
# kind -> (profile lines, what interrupts the job once it has made 6 steps, whether hpc's job script requeues it)
INTERRUPTIONS = {
    "warning signal (scancel --signal=USR1)": ("", "signal", True),
    "preempted, GraceTime=30 (partition lowgrace)": ("partition: lowgrace\nsbatch_extra: ['--exclusive']\n", "preempt",
                                                     True),
    "preempted, GraceTime=0 (partition low)": ("partition: low\nsbatch_extra: ['--exclusive']\n", "preempt", False),
    "lost node (slurm-local kill-node)": ("", "kill-node", True),
}


def interruption_to_resume(work: Path, kind: str) -> list:
    """One 2-node srun/DDP job interrupted after its 6th step; each stage timed from outside, from the moment
    of the interruption: checkpoint committed, SLURM restart count up, batch script running again, training
    resumed (checkpoint loaded), first new step done."""
    profile, how, hpc_requeues = INTERRUPTIONS[kind]
    project = work / f"interrupt-{how}-{len(list(work.iterdir()))}"
    project.mkdir()
    shutil.copy(ROOT / "tests" / "resume_worker.py", project)
    (project / "p.yaml").write_text(f"name: bench\nextends: slurm-local\npreemption:\n  max_requeues: 2\n{profile}")
    # the periodic checkpoint at step 5 is committed before the interruption at step 6: a newer one is the stop's
    spec = {"strategy": "ddp", "steps": 200, "save_every": 5, "sleep": 0.5, "project": str(project / "run"),
            "out": str(project / "o.pt")}
    out = subprocess.run([sys.executable, "-m", "hpc", "submit", "--json", "-p", "./p.yaml", "-N", "2",
                          "--ntasks-per-node", "1", "resume_worker.py", "--", json.dumps(spec)], cwd=project,
                         capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    jobid_file = Path(info["job_dir"]) / "tasks" / "0.jobid"
    progress, checkpoints = project / "run" / "progress", project / "run" / "checkpoints"
    while _number(progress) < 6:
        time.sleep(0.05)
    victim = (project / "run" / "host-a0-r1").read_text()
    before = _newest_step(checkpoints)
    t0 = time.perf_counter()
    if how == "signal":
        subprocess.run(["scancel", "--signal=USR1", info["job_id"]], check=True)
    elif how == "preempt":
        subprocess.run(["sbatch", "-p", "high", "-N3", "--exclusive", f"--output={project}/preemptor.out",
                        "--wrap", "sleep 1"], check=True, capture_output=True)
    else:
        subprocess.run([str(SLURM_LOCAL), "kill-node", victim], check=True, capture_output=True)
    marks: dict[str, float] = {}
    try:
        while "first step" not in marks:
            now = time.perf_counter() - t0
            assert now < 300, f"{kind}: nothing after 300 s ({marks})"
            if "saved" not in marks and _newest_step(checkpoints) > before:
                marks["saved"] = now
            if "requeued" not in marks and "Restarts=1" in subprocess.run(
                    ["scontrol", "show", "job", info["job_id"]], capture_output=True, text=True).stdout:
                marks["requeued"] = now
            if "running" not in marks and jobid_file.read_text().split()[1:] == ["1"]:
                marks["running"] = now
            if "running" in marks and "resumed" not in marks and _resumed(info):
                marks["resumed"], stamp = now, progress.stat().st_mtime_ns
            if "resumed" in marks and progress.stat().st_mtime_ns != stamp:
                marks["first step"] = now
            time.sleep(0.05)
    finally:
        subprocess.run(["scancel", info["job_id"]])
        if how == "kill-node":
            subprocess.run([str(SLURM_LOCAL), "revive-node", victim], capture_output=True)
    saved = marks.get("saved")
    # until the requeue when hpc's job script does it (save, exit, lost-node detection), and start + load after
    hpc_share = (marks["requeued"] if hpc_requeues else 0.0) + (marks["first step"] - marks["running"])
    return [kind, _fmt(saved), _fmt(marks["requeued"]), _fmt(marks["running"]), _fmt(marks["resumed"]),
            _fmt(marks["first step"]), _fmt(hpc_share)]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _number(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def _newest_step(checkpoints: Path) -> int:
    steps = [int(p.parent.name.split("-")[1]) for p in checkpoints.glob("step-*/manifest.json")]
    return max(steps, default=-1)


def _resumed(info: dict) -> bool:
    logs = Path(info["job_dir"]) / "logs"
    return any("resumed from" in p.read_text(errors="replace") for p in logs.glob("*.out"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--crash-trials", type=int, default=50)
    parser.add_argument("--signal", action="store_true",
                        help="also time interruption -> training again on scripts/slurm-local")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the training state lives")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpc-bench-ckpt-", dir=args.dir))
    try:
        rows, nbytes = bench_io(args.gib, args.repeat, work, args.device)
        print(f"state: {nbytes / 2**30:.2f} GiB (parameters + AdamW moments) on {args.device}, "
              f"median of {args.repeat}, {work}")
        print(table(["what", "seconds", "GiB/s", "vs"], rows))
        if args.crash_trials:
            print(table(["crash safety", "count"], crash_trials(args.crash_trials, work)))
        if args.signal:
            rows = []
            for kind in INTERRUPTIONS:
                print(f"timing: {kind} ...", file=sys.stderr, flush=True)
                rows.append(interruption_to_resume(work, kind))
            print("seconds from the interruption (2 nodes, srun, DDP; 'hpc' = until the requeue when hpc's job "
                  "script does it, + start and load)")
            print(table(["interruption", "saved", "requeued", "running", "resumed", "first step", "hpc"], rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
