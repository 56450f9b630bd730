"""`hpc env`: what a bug report needs, gathered without importing torch."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import click

from hpc import ACCELERATE_API_VERSION, HPC_VERSION
from hpc.cli.output import echo_json, table

_PACKAGES = ("torch", "deepspeed", "submitit", "jinja2", "click", "pyyaml", "psutil")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _scheduler() -> dict:
    sbatch = shutil.which("sbatch")
    started_by = ("slurm" if "SLURM_JOB_ID" in os.environ else
                  "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else
                  "submitit" if "SUBMITIT_EXECUTOR" in os.environ else None)
    return {
        "sbatch": sbatch,
        # `sbatch --version` reads no config and contacts no controller
        "slurm_version": _run([sbatch, "--version"]) if sbatch else None,
        "slurm_conf": os.environ.get("SLURM_CONF"),
        "inside_job": started_by,
        "job_id": os.environ.get("SLURM_JOB_ID"),
    }


def _gpus() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if smi:
        out = _run([smi, "-L"])
        return out.splitlines() if out else []
    return (sorted(p.name for p in Path("/proc/driver/nvidia/gpus").glob("*"))
            if Path("/proc/driver/nvidia/gpus").is_dir() else [])


def _nics() -> list[dict]:
    nics = []
    for dev in sorted(Path("/sys/class/net").glob("*")):
        state = (dev / "operstate").read_text().strip() if (dev / "operstate").exists() else "?"
        nics.append({"name": dev.name, "state": state})
    return nics


def _profile() -> dict:
    from hpc.cluster.config import profiles
    from hpc.errors import HpcError

    ref = os.environ.get("HPC_PROFILE") or profiles.DEFAULT_PROFILE
    try:
        prof, path, _ = profiles.load(ref)
        return {"name": prof.name, "path": str(path), "scheduler": prof.scheduler, "error": None}
    except HpcError as e:
        return {"name": ref, "path": None, "scheduler": None, "error": str(e)}


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def env(as_json):
    """Versions, detected scheduler, profile, GPUs and NICs: paste it into a bug report."""
    info = {
        "hpc": HPC_VERSION, "accelerate_api": ACCELERATE_API_VERSION,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "packages": {p: _version(p) for p in _PACKAGES},
        "scheduler": _scheduler(),
        "profile": _profile(),
        "gpus": _gpus(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "nics": _nics(),
    }
    if as_json:
        echo_json(info)
        return
    sched, prof = info["scheduler"], info["profile"]
    rows = [
        ("hpc", info["hpc"]),
        ("python", info["python"]),
        ("platform", info["platform"]),
        *((name, v or "not installed") for name, v in info["packages"].items()),
        ("slurm", sched["slurm_version"] or "not found"),
        ("SLURM_CONF", sched["slurm_conf"] or "-"),
        ("inside a job", sched["inside_job"] or "no"),
        ("profile", f"{prof['name']} ({prof['path'] or prof['error']})"),
        ("gpus", "; ".join(info["gpus"]) or "none seen"),
        ("nics", ", ".join(f"{n['name']} ({n['state']})" for n in info["nics"]) or "none"),
    ]
    click.echo(table(["what", "value"], rows))
