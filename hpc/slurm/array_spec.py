"""SLURM job array specs (``0-99%8``, ``1,3,5-7``, ``0-30:10``): parsed with their size counted before any task
id is built, so ``0-99999999999999999999`` is one line, not an OverflowError or a list of a billion ints.

SLURM refuses an index at or above MaxArraySize (slurm.conf; 1001 unless a site raises it, 4000001 at most).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpc.errors import HpcError, shown

DEFAULT_MAX_ARRAY_SIZE = 1001  # slurm.conf's MaxArraySize when a site does not set it
LARGEST_MAX_ARRAY_SIZE = 4_000_001  # the most any site's MaxArraySize can be
_ITEM = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
_FIX = "write e.g. 0-99%8 or 1,3,5-7"


@dataclass(frozen=True)
class ArraySpec:
    ranges: tuple[tuple[int, int, int], ...]  # (first, last, step), last included
    max_running: int | None  # the %N limit on tasks running at once

    @property
    def count(self) -> int:
        """Task ids written, a duplicate counted again (SLURM drops it)."""
        return sum((last - first) // step + 1 for first, last, step in self.ranges)

    @property
    def max_index(self) -> int:
        return max(first + (last - first) // step * step for first, last, step in self.ranges)

    def indices(self) -> list[int]:
        out: list[int] = []
        for first, last, step in self.ranges:
            out.extend(range(first, last + 1, step))
        return out


def parse(spec: str, max_array_size: int = LARGEST_MAX_ARRAY_SIZE) -> ArraySpec:
    """``spec`` checked and sized; every index must be below ``max_array_size`` (the cluster's MaxArraySize)."""
    body, sep, limit = spec.partition("%")
    if sep and not re.fullmatch(r"\d{1,9}", limit):
        raise HpcError(f"{shown(spec)} is not a SLURM array spec (%N needs a number)", fix=_FIX)
    if sep and int(limit) < 1:
        raise HpcError(f"{shown(spec)}: %{limit} would run no task", fix="write %1 or more")
    if len(body) > 100_000:  # many thousand comma-separated ids; the regex below stays linear, but why read it
        raise HpcError(f"{shown(spec)} is too long for a SLURM array spec", fix="write ranges like 0-999")
    ranges = []
    for item in body.split(","):
        m = _ITEM.fullmatch(item)
        if not m:
            part = f" ({shown(item)} is no index or range)" if item != spec else ""
            raise HpcError(f"{shown(spec)} is not a SLURM array spec{part}", fix=_FIX)
        if max(len(g or "") for g in m.groups()) > 9:  # above any MaxArraySize; int() of it could be slow
            raise HpcError(f"{shown(item)} holds a number above any cluster's MaxArraySize ({LARGEST_MAX_ARRAY_SIZE})",
                           fix=f"use indices below {max_array_size}")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if last < first:
            raise HpcError(f"range {m.group(1)}-{m.group(2)} runs backwards", fix=f"write {m.group(2)}-{m.group(1)}")
        if step < 1:
            raise HpcError(f"range {shown(item)} has step 0", fix="write a step of 1 or more, e.g. 0-30:10")
        top = first + (last - first) // step * step
        if top >= max_array_size:
            raise HpcError(f"index {top} is not below the cluster's MaxArraySize {max_array_size}",
                           fix=f"use indices 0-{max_array_size - 1}, or set the profile's max_array_size to the "
                               "cluster's (scontrol show config | grep MaxArraySize)")
        ranges.append((first, top, step))
    parsed = ArraySpec(tuple(ranges), int(limit) if sep else None)
    if parsed.count > max_array_size:  # only repeated ids get here: each one is below max_array_size
        raise HpcError(f"{shown(spec)} names {parsed.count} task ids, more than MaxArraySize {max_array_size}",
                       fix="write each index once")
    return parsed


def indices(spec: str) -> list[int]:
    """'0-99%8', '1,3,5-7', '0-10:2' -> the task ids (counted before they are built)."""
    return parse(spec).indices()
