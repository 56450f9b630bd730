"""SLURM's time-limit and memory-size spellings, parsed to numbers and written back."""

from __future__ import annotations

import re

from hpc.errors import HpcError

UNLIMITED = None  # a time limit of "UNLIMITED"/"INFINITE"

_TIME_FIX = "use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 2-00:00:00)"


def parse_time(text: str | int) -> int | None:
    """sbatch ``--time`` in any of its spellings -> seconds; ``None`` for UNLIMITED/INFINITE.

    A bare number is minutes, as sbatch reads it.
    """
    if isinstance(text, bool):
        raise HpcError(f"time limit {text!r} is not a duration", fix=_TIME_FIX)
    if isinstance(text, int):
        if text <= 0:
            raise HpcError(f"time limit {text!r} must be positive", fix=_TIME_FIX)
        return text * 60
    s = str(text).strip()
    if s.upper() in ("UNLIMITED", "INFINITE"):
        return UNLIMITED
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", s)
    if not m:
        raise HpcError(f"time limit {text!r} is not a SLURM duration", fix=_TIME_FIX)
    days, a, b, c = m.groups()
    a_, b_, c_ = int(a), int(b or 0), int(c or 0)
    if days is not None:
        # D-HH, D-HH:MM, D-HH:MM:SS
        seconds = int(days) * 86400 + a_ * 3600 + b_ * 60 + c_
        fields = [(b_, b), (c_, c)]
    elif c is not None:
        seconds = a_ * 3600 + b_ * 60 + c_  # HH:MM:SS
        fields = [(b_, b), (c_, c)]
    elif b is not None:
        seconds = a_ * 60 + b_  # MM:SS
        fields = [(b_, b)]
    else:
        seconds = a_ * 60  # MM
        fields = []
    if any(raw is not None and val >= 60 for val, raw in fields):
        raise HpcError(f"time limit {text!r}: minutes and seconds must be below 60", fix=_TIME_FIX)
    if seconds <= 0:
        raise HpcError(f"time limit {text!r} must be positive", fix=_TIME_FIX)
    return seconds


def format_time(seconds: int | None) -> str:
    """Seconds -> ``D-HH:MM:SS`` (or ``HH:MM:SS`` under a day); ``None`` -> ``UNLIMITED``."""
    if seconds is None:
        return "UNLIMITED"
    days, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    hms = f"{h:02d}:{m:02d}:{s:02d}"
    return f"{days}-{hms}" if days else hms


_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_MEM_FIX = "use a number with K, M, G or T (e.g. 64G); a bare number is megabytes"


def parse_memory(text: str | int) -> int:
    """A SLURM memory size -> MiB (rounded up). A bare number is MiB, as sbatch reads it."""
    if isinstance(text, bool):
        raise HpcError(f"memory {text!r} is not a size", fix=_MEM_FIX)
    if isinstance(text, int):
        if text <= 0:
            raise HpcError(f"memory {text!r} must be positive", fix=_MEM_FIX)
        return text
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT])?(?:i?B)?", str(text).strip(), re.IGNORECASE)
    if not m:
        raise HpcError(f"memory {text!r} is not a size", fix=_MEM_FIX)
    number, unit = float(m.group(1)), (m.group(2) or "M").upper()
    mib = number * _MEM_UNITS[unit]
    if mib <= 0:
        raise HpcError(f"memory {text!r} must be positive", fix=_MEM_FIX)
    whole = int(mib)
    return whole if whole == mib else whole + 1


def format_memory(mib: int) -> str:
    """MiB -> the shortest exact SLURM spelling (``64G``, ``1500M``)."""
    for unit in ("T", "G"):
        size = _MEM_UNITS[unit]
        if mib % size == 0:
            return f"{mib // int(size)}{unit}"
    return f"{mib}M"
