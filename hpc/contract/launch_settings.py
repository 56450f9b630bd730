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
