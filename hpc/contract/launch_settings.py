"""The launch settings the job's processes read back (through the runtime config) as well as the profile sets:
which launcher starts the ranks, and how the job learns it must stop. Torch-free."""

from dataclasses import dataclass, field, fields
from typing import Literal

from hpc.contract import checks

Launcher = Literal["srun", "torchrun", "deepspeed"]


def checked(fn, **kw):
    return field(metadata={"check": fn}, **kw)


# Each generated dataclass method is compiled at import, on every CLI start: only __init__ is generated,
# and these records are never mutated after validation.
record = dataclass(repr=False, eq=False)


class ReprByFields:
    def __repr__(self) -> str:
        inner = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return f"{type(self).__name__}({inner})"


@record
class Preemption(ReprByFields):
    """How the job learns it must stop, and whether it comes back."""

    signal: str = checked(checks.signal, default="USR1")
    lead_time: int = checked(checks.non_negative, default=120)  # seconds before the time limit
    requeue: bool = True
    max_requeues: int = checked(checks.non_negative, default=3)
    # requeues stop when the newest checkpoint (or a batch job's items) has not advanced over this many attempts
    # in a row: the job ends FAILED with that reason instead of requeueing forever; 0: never stop for that
    max_attempts_without_progress: int = checked(checks.non_negative, default=3)


@record
class Vetting(ReprByFields):
    """The checks every node of a SLURM job runs before the ranks start (hpc.runtime.vetting): the profile's
    health_check lines, free memory and disk, the accelerators, then each node's bandwidth to two others and one
    all-reduce over all. A node that fails is named and left out (the job then starts on its spare nodes, or
    requeues without it). ``enabled`` None: on for jobs of 2 or more nodes, with spare nodes, or a health_check."""

    enabled: bool | None = None
    min_free_memory: str = checked(checks.memory, default="1G")
    min_free_disk: str = checked(checks.memory, default="1G")  # in the job folder's filesystem and in $TMPDIR
    min_bandwidth: float | None = checked(checks.non_negative_number, default=None)  # GB/s, each node's best pair
    relative_speed: float = checked(checks.fraction, default=0.5)  # below this share of the median node: slow
    timeout: int = checked(checks.positive, default=120)  # seconds for the whole vetting step
