"""What one node checks of itself: the profile's health_check lines, free memory and disk, its accelerators.

Each check is (name, ok, detail). Torch-free except the accelerator count, which asks torch only where CUDA is
expected; nvidia-smi's own counters (uncorrected ECC errors, pending page retirements, hardware slowdown) and the
kernel log's XID errors, where readable, catch a GPU that still answers but should not be trusted.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass

import psutil

from hpc.slurm import formats

# XID errors that mean the GPU (or its link) cannot be trusted until the node is drained: double-bit ECC,
# row-remapping failure, NVLink error, fallen off the bus, uncontained ECC
_BAD_XIDS = {48, 63, 64, 74, 79, 95}
_XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def health_check_lines(lines: list[str], timeout_s: float) -> list[Check]:
    """The profile's own lines, each in bash; a non-zero exit (or no exit within the time) marks the node bad."""
    out = []
    for line in lines:
        try:
            proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            out.append(Check(f"health_check: {line}", False, f"no answer within {timeout_s:g} s"))
            continue
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        detail = f"exit {proc.returncode}" + (f": {said[-1][:200]}" if said else "")
        out.append(Check(f"health_check: {line}", proc.returncode == 0, "" if proc.returncode == 0 else detail))
    return out


def _bytes(spec: str) -> int:
    return formats.parse_memory(spec) * 1024 * 1024


def free_memory(minimum: str) -> Check:
    free = psutil.virtual_memory().available
    return Check("free memory", free >= _bytes(minimum), f"{free / 2**30:.1f} GiB free (at least {minimum})")


def free_disk(paths: list[str], minimum: str) -> list[Check]:
    out = []
    for path in dict.fromkeys(p for p in paths if p):
        try:
            free = shutil.disk_usage(path).free
        except OSError as e:
            out.append(Check(f"free disk in {path}", False, e.strerror or str(e)))
            continue
        out.append(Check(f"free disk in {path}", free >= _bytes(minimum),
                         f"{free / 2**30:.1f} GiB free (at least {minimum})"))
    return out


def expected_gpus(env=os.environ) -> int:
    """The GPUs SLURM gave this node's step, 0 where it gave none."""
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS"):
        value = env.get(key, "")
        if value.isdigit():
            return int(value)
        if value and key == "SLURM_JOB_GPUS":
            return len(value.split(","))
    return 0


def gpu_count(expected: int) -> Check:
    import torch  # only where GPUs are expected: a CPU node's vetting needs no CUDA probe

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Check("GPUs visible", seen >= expected, f"{seen} of {expected}")


def nvidia_smi() -> list[Check]:
    """nvidia-smi's counters per GPU; nothing where nvidia-smi is missing."""
    if not shutil.which("nvidia-smi"):
        return []
    query = "index,ecc.errors.uncorrected.volatile.total,retired_pages.pending,clocks_event_reasons.hw_slowdown"
    try:
        proc = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return [Check("nvidia-smi", False, "no answer within 30 s (a GPU that hangs the driver)")]
    if proc.returncode != 0:
        return [Check("nvidia-smi", False, (proc.stderr or proc.stdout).strip()[:200])]
    out = []
    for row in proc.stdout.strip().splitlines():
        index, ecc, pending, slowdown = (f.strip() for f in (row.split(",") + ["", "", ""])[:4])
        problems = []
        if ecc.isdigit() and int(ecc) > 0:
            problems.append(f"{ecc} uncorrected ECC errors")
        if pending.lower() == "yes":
            problems.append("page retirement pending")
        if slowdown.lower() == "active":
            problems.append("hardware slowdown active")
        out.append(Check(f"GPU {index}", not problems, ", ".join(problems)))
    return out


def xid_errors() -> Check | None:
    """The kernel log's fatal XID errors since boot; None where the log is not readable (most sites)."""
    try:
        proc = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    bad = [int(m.group(1)) for m in _XID.finditer(proc.stdout) if int(m.group(1)) in _BAD_XIDS]
    return Check("XID errors", not bad, f"fatal XID {sorted(set(bad))} in the kernel log" if bad else "")
