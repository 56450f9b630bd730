"""Does the warning signal come early enough? Stopping takes the step in flight plus a checkpoint save.

The job's rank 0 writes what it measured to <job dir>/timings.json after each save; the runtime warns in the
job's log, and the next submit of the same job name and profile warns before it is queued. Torch-free: the
submit path reads it too.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from hpc.contract import layout
from hpc.contract.atomic import atomic_write

FILE = layout.TIMINGS


@dataclass
class Timings:
    step_s: float  # the slowest recent step (a stop waits for the step in flight)
    save_s: float  # the last synchronous save (what a stop does)

    @property
    def needed_s(self) -> float:
        return self.step_s + self.save_s


def shortfall(timings: Timings, lead_time: float) -> str | None:
    """A one-line warning when lead_time leaves no room to finish a step and save; None when it does."""
    if lead_time >= timings.needed_s:
        return None
    advice = math.ceil(timings.needed_s * 1.5 / 10) * 10  # room for a slower filesystem on the day
    return (f"preemption.lead_time is {lead_time:g} s, but a step takes up to {timings.step_s:.1f} s and a save "
            f"{timings.save_s:.1f} s: the job may be killed before its checkpoint commits; set "
            f"preemption.lead_time to {advice} or more in the profile")


def write(job_dir: str | os.PathLike, timings: Timings) -> None:
    atomic_write(Path(job_dir) / FILE, json.dumps(asdict(timings)) + "\n")


def read(job_dir: str | os.PathLike, files=None) -> Timings | None:
    """What a job measured; ``files``: its folder as its backend reads it (over SSH for a remote cluster)."""
    try:
        data = files.read(FILE) if files is not None else (Path(job_dir) / FILE).read_bytes()
        raw = json.loads(data or b"")
        return Timings(float(raw["step_s"]), float(raw["save_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
