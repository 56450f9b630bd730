"""Field checks shared by profiles and job specs. Each returns the value to keep or raises HpcError."""

from __future__ import annotations

import math
import os
import re

from hpc.errors import HpcError, shown
from hpc.slurm import array_spec, formats, hostlist

# Values that land on '#SBATCH' lines or in file names: no whitespace, quotes, '$', backticks or ';'.
_SAFE = re.compile(r"[A-Za-z0-9._,:@+=/%-]+")
_CONSTRAINT = re.compile(r"[A-Za-z0-9._,:@+=/%&|()\[\]*!-]+")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|PRIVATE_KEY", re.IGNORECASE)
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT")


def positive(value: int) -> int:
    if value < 1:
        raise HpcError("must be at least 1", fix="give a positive whole number")
    return value


def min_nodes(value: int) -> int:
    """The fewest nodes a requeued job may run on (checked against its `nodes` once precedence knows them)."""
    if value < 1:
        raise HpcError("must be at least 1 (the fewest nodes a requeue may run the job on)",
                       fix="give 1 up to the job's nodes, or drop min_nodes")
    return value


def non_negative(value: int) -> int:
    if value < 0:
        raise HpcError("must not be negative", fix="give 0 or more")
    return value


def _finite(value: float, zero_ok: bool, problem: str, fix: str) -> float:
    """nan and inf compare false both ways, so a bound alone lets them through: they are refused first."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise HpcError(problem, fix=fix)
    return value


def seconds(value: float) -> float:
    """A duration (a timeout, an interval): a finite number, 0 meaning off where the key allows it."""
    return _finite(value, True, "is not a finite number of seconds, 0 or more", "give seconds, e.g. 300")


def positive_seconds(value: float) -> float:
    return _finite(value, False, "is not a finite positive number of seconds", "give seconds, e.g. 5")


def non_negative_number(value: float) -> float:
    return _finite(value, True, "is not a finite number, 0 or more", "give e.g. 1.0 (0: off)")


LOCAL_PROCESSES_PER_CPU = 4


def local_processes(value: int) -> int:
    """Processes started on this machine (the local profile, `hpc launch --nproc`): a typo of a few zeros must not
    fork a million Pythons."""
    positive(value)
    cap = max(8, LOCAL_PROCESSES_PER_CPU * (os.cpu_count() or 1))
    if value > cap:
        raise HpcError(f"is more processes than this machine can start (at most {cap}: "
                       f"{LOCAL_PROCESSES_PER_CPU} per CPU)",
                       fix=f"ask for at most {cap}, or submit to a cluster profile")
    return value


def checkpoint_keep(value: int) -> int:
    if value < 2:
        raise HpcError("must be at least 2 (the newest checkpoint may be damaged; the one before it must exist)",
                       fix="keep 2 or more")
    return value


def zero_stage(value: int) -> int:
    if value not in (0, 1, 2, 3):
        raise HpcError("is not a ZeRO stage", fix="use 0, 1, 2 or 3")
    return value


_CPU_BIND = re.compile(r"(verbose,)?(none|rank|rank_ldom|sockets|cores|threads|ldoms|boards|"
                       r"(map|mask)_(cpu|ldom):[0-9a-fA-Fx,*]+)(,verbose)?")


def cpu_bind(value: str) -> str:
    if not _CPU_BIND.fullmatch(value):
        raise HpcError("is not an srun --cpu-bind type", fix="use e.g. cores, sockets, none or map_cpu:0,4")
    return value


def port(value: int) -> int:
    if not 1024 <= value <= 65535:
        raise HpcError("is not a port a job may listen on", fix="use a port between 1024 and 65535")
    return value


def gpu_ids(value: str) -> str:
    if not re.fullmatch(r"\d+(,\d+)*", value):
        raise HpcError("must be GPU numbers", fix="write e.g. 0,1")
    return value


def safe_value(value: str) -> str:
    if not _SAFE.fullmatch(value):
        raise HpcError("holds characters SLURM values cannot have (whitespace, quotes, $, `, ;, ...)",
                       fix="use letters, digits and . _ , : @ + = / % -")
    return value


def ssh_destination(value: str) -> str:
    safe_value(value)
    if value.startswith("-"):  # ssh and rsync would read it as an option
        raise HpcError("starts with '-'", fix="give a host name, user@host or an alias from ~/.ssh/config")
    return value


def remote_folder(value: str) -> str:
    safe_value(value)
    if not value.startswith("/") or "%" in value:  # relative: to what? % is expanded by sbatch in log names
        raise HpcError("must be an absolute path on the cluster, without '%'", fix="e.g. /scratch/$USER/hpc-jobs, "
                       "spelled out")
    return value


def constraint(value: str) -> str:
    if not _CONSTRAINT.fullmatch(value):
        raise HpcError("is not a SLURM constraint expression", fix="use features joined by & or |, e.g. gpu&hbm80g")
    return value


def job_name(value: str) -> str:
    if not _NAME.fullmatch(value) or len(value) > 128:
        raise HpcError("is not a safe job name (it names files and #SBATCH lines)",
                       fix="use letters, digits, '.', '_', '+' and '-', starting with a letter or digit")
    return value


def nodelist(value: str) -> str:
    if not hostlist.expand(value):
        raise HpcError("names no hosts", fix="write e.g. node[01-04]")
    return value


def time_limit(value: str) -> str:
    formats.parse_time(value)
    return value


def memory(value: str) -> str:
    return formats.format_memory(formats.parse_memory(value))


def env_names(value: list[str]) -> list[str]:
    for name in value:
        if not _ENV_NAME.fullmatch(name):
            raise HpcError(f"{shown(name)} is not an environment variable name", fix="use letters, digits and _")
    return value


def env_values(value: dict[str, str]) -> dict[str, str]:
    for name, text in value.items():
        if not _ENV_NAME.fullmatch(name):
            raise HpcError(f"{shown(name)} is not an environment variable name", fix="use letters, digits and _")
        if _SECRET.search(name):
            raise HpcError(f"{name} looks like a secret; its value would be written into the job script",
                           fix=f"leave it out and list {name} under env_passthrough")
        if "\0" in text:
            raise HpcError(f"{name} holds a NUL byte", fix="remove it")
    return value


def shell_lines(value: list[str]) -> list[str]:
    for line in value:
        if "\n" in line or "\0" in line:
            raise HpcError("each entry must be one line", fix="split it into several list entries")
    return value


def resume_args(value: list[str]) -> list[str]:
    shell_lines(value)
    if not any("{checkpoint}" in arg for arg in value):
        raise HpcError("names no {checkpoint}: a requeued attempt would not be told where to resume from",
                       fix="e.g. [--resume_from_checkpoint, '{checkpoint}']")
    return value


def resume_save_as(value: str) -> str:
    if "{step}" not in value or value.count("{") != 1 or value.count("}") != 1:
        raise HpcError("must hold {step} (the script's optimizer steps) and no other {...}",
                       fix="e.g. out/step_{step}")
    safe_value(value.replace("{step}", "0"))
    return value


def module_names(value: list[str]) -> list[str]:
    for name in value:
        safe_value(name)
    return value


def sbatch_extra(value: list[str]) -> list[str]:
    for item in value:
        if not re.fullmatch(r"--[a-z][a-z0-9-]*(=[^\s'\"`$;\\]+)?", item):
            raise HpcError(f"{shown(item)} is not an sbatch option of the form --key[=value]",
                           fix="write e.g. --exclusive or --mail-type=END (no spaces, quotes or $)")
    return value


def signal(value: str) -> str:
    name = value.upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise HpcError("is not a signal hpc can use", fix=f"use one of {', '.join(SIGNALS)}")
    return name


def max_array_size(value: int) -> int:
    if not 1 <= value <= array_spec.LARGEST_MAX_ARRAY_SIZE:
        raise HpcError(f"is not a SLURM MaxArraySize (1 to {array_spec.LARGEST_MAX_ARRAY_SIZE})",
                       fix="copy it from `scontrol show config | grep MaxArraySize`")
    return value


def array(value: str) -> str:
    array_spec.parse(value)  # the profile's max_array_size is checked against it once the profile is known
    return value


def elastic(value: str) -> str:
    m = re.fullmatch(r"(\d+):(\d+)", value)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise HpcError("is not MIN:MAX nodes with 1 <= MIN <= MAX", fix="write e.g. 1:4")
    return value


DEPENDENCY_TYPES = ("afterok", "afterany", "afternotok", "after", "aftercorr")


def after(value: list[str]) -> list[str]:
    out = []
    for item in value:
        m = re.fullmatch(r"(\d+(?:_\d+)?)(?::([a-z]+))?", item)
        if not m or (m.group(2) and m.group(2) not in DEPENDENCY_TYPES):
            raise HpcError(f"{shown(item)} is not JOB[:type]",
                           fix=f"write e.g. 12345 or 12345:afterany (types: {', '.join(DEPENDENCY_TYPES)})")
        out.append(f"{m.group(1)}:{m.group(2) or 'afterok'}")
    return out


_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")


def notify_target(value: str) -> str:
    """A webhook (http:// or https:// URL) or one email address."""
    if re.fullmatch(r"https?://[^\s/$.?#][^\s]*", value) or _EMAIL.fullmatch(value):
        return value
    raise HpcError("is neither a webhook URL nor an email address",
                   fix="e.g. https://hooks.example.com/T0/B0/xyz or you@example.org")


def ratio_above_one(value: float) -> float:
    value = _finite(value, zero_ok=False, problem="must be a number above 1", fix="e.g. 1.5: 50% slower")
    if value <= 1:
        raise HpcError("must be above 1 (how many times slower than the median)", fix="e.g. 1.5")
    return value


def fraction(value: float) -> float:
    value = _finite(value, zero_ok=True, problem="must be a number from 0 to 1", fix="e.g. 0.5")
    if not 0 <= value <= 1:
        raise HpcError("must be from 0 to 1", fix="e.g. 0.5: half the median node's")
    return value


def absolute_folder(value: str) -> str:
    """A folder every node has at the same path (a node-local one: /dev/shm, /tmp, a local SSD)."""
    safe_value(value)
    if not value.startswith("/"):
        raise HpcError("must be an absolute path (a node-local folder, the same on every node)",
                       fix="give one like /dev/shm or /tmp")
    return value


def fast_tier_replicas(value: int) -> int:
    """How many nodes hold each node's part of the fast tier: its own (1), or its own and the next node's (2)."""
    if value not in (1, 2):
        raise HpcError("must be 1 (each node's own copy only) or 2 (also a copy on the next node)",
                       fix="give 1 or 2")
    return value
