"""`accelerate.utils.environment`: reading flags from the environment, changing it for a block, and facts about
the machine (GPUs, NUMA) that launchers ask."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

from hpc.errors import HpcError

_TRUE = {"y", "yes", "t", "true", "on", "1"}
_FALSE = {"n", "no", "f", "false", "off", "0"}


def str_to_bool(value, to_bool: bool = False) -> int | bool:
    """1/0 (or True/False with ``to_bool``) for the spellings of yes and no; anything else is a mistake."""
    word = str(value).lower()
    if word in _TRUE:
        return True if to_bool else 1
    if word in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}")


def get_int_from_env(env_keys, default):
    """The first of ``env_keys`` set to a non-negative integer, else ``default``."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    return bool(str_to_bool(os.environ.get(key, str(default))))


def parse_choice_from_env(key: str, default: str = "no") -> str:
    return os.environ.get(key, str(default))


def convert_dict_to_env_variables(current_env: dict) -> list[str]:
    """``KEY=value`` lines for a .env file; a key or value that would break the line is left out with a warning."""
    import warnings

    lines, bad = [], []
    for key, value in current_env.items():
        if any(ch in f"{key}{value}" for ch in ";\n") or not str(value):
            bad.append(key)
        else:
            lines.append(f"{key}={value}\n")
    if bad:
        warnings.warn(f"Some environment variables contain invalid characters and were left out: {bad}")
    return lines


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """The block runs with an empty os.environ; the old one comes back after, also when the block raised."""
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def patch_environment(**kwargs) -> Iterator[None]:
    """Sets the upper-cased names for the block (a Path or number becomes a string) and restores what was
    there before, removing what was not."""
    before = {}
    for key, value in kwargs.items():
        key = key.upper()
        before[key] = os.environ.get(key)
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def purge_accelerate_environment(func_or_cls):
    """A decorator: the ACCELERATE_* variables the function (or each test method of a class) adds are removed after
    it, so one test's launcher settings do not leak into the next."""
    import functools
    import inspect

    def wrap(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            before = {k for k in os.environ if k.startswith("ACCELERATE_")}
            try:
                return function(*args, **kwargs)
            finally:
                for key in [k for k in os.environ if k.startswith("ACCELERATE_") and k not in before]:
                    del os.environ[key]
        return run

    if inspect.isclass(func_or_cls):
        for name, member in list(vars(func_or_cls).items()):
            if callable(member) and (name.startswith("test") or name in ("setUp", "tearDown")):
                setattr(func_or_cls, name, wrap(member))
        return func_or_cls
    return wrap(func_or_cls)


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of ``library_names`` already imported in this process (a notebook launcher must start before they
    touch the GPU)."""
    return [name for name in library_names if name in sys.modules]


def get_current_device_type() -> tuple[str, str]:
    """(device type, the variable that selects visible devices): CUDA here, else MPS, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return "cuda", "CUDA_VISIBLE_DEVICES"
    if torch.backends.mps.is_available():
        return "mps", "MPS_VISIBLE_DEVICES"
    return "cpu", "CUDA_VISIBLE_DEVICES"


def get_gpu_info() -> tuple[list[str], int]:
    """(GPU names, count) from nvidia-smi; none when it is not installed."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return [], 0
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names, len(names)


def check_cuda_p2p_ib_support() -> bool:
    """False for the consumer GPUs (RTX 3090/4090) whose peer-to-peer and InfiniBand paths NCCL must not use."""
    names, count = get_gpu_info()
    return not (count > 1 and any(card in name for name in names for card in ("RTX 3090", "RTX 4090")))


def check_cuda_fp8_capability() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def get_cpu_distributed_information() -> SimpleNamespace:
    """rank, world_size, local_rank, local_world_size as the MPI/torchrun variables give them (None if unset)."""
    def first(*keys):
        value = get_int_from_env(keys, None)
        return value

    return SimpleNamespace(rank=first("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"),
                           world_size=first("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"),
                           local_rank=first("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                            "MV2_COMM_WORLD_LOCAL_RANK"),
                           local_world_size=first("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS",
                                                  "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"))


def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pins this process to the CPUs of the NUMA node nearest its GPU (read from sysfs, as Accelerate does
    through pynvml). Linux only; with no GPU there is no node to be near, and it says so."""
    import torch

    if platform.system() != "Linux" or not hasattr(os, "sched_setaffinity"):
        raise HpcError("set_numa_affinity needs Linux (it sets the CPU affinity through sched_setaffinity)")
    if not torch.cuda.is_available():
        raise HpcError("set_numa_affinity pins a process to its GPU's NUMA node: no CUDA GPU here",
                       fix="call it only when torch.cuda.is_available()")
    bus = torch.cuda.get_device_properties(local_process_index).pci_bus_id.lower()
    try:
        cpus = open(f"/sys/bus/pci/devices/{bus}/local_cpulist").read().strip()
    except OSError as err:
        raise HpcError(f"set_numa_affinity: cannot read GPU {local_process_index}'s NUMA CPUs: {err}") from None
    chosen = set()
    for part in cpus.split(","):
        low, _, high = part.partition("-")
        chosen.update(range(int(low), int(high or low) + 1))
    os.sched_setaffinity(0, chosen)
    if verbose:
        print(f"Assigning {len(chosen)} cpu cores to process {local_process_index}: {sorted(chosen)}")
