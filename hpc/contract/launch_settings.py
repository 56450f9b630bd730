"""The launch settings the job's processes read back (through the runtime config) as well as the profile sets:
which launcher starts the ranks, and how the job learns it must stop. Torch-free."""

from dataclasses import dataclass, field, fields
from typing import Literal

from hpc.contract import checks
from hpc.errors import ConfigError

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


@record
class FastTier(ReprByFields):
    """The checkpoint tier in each node's memory (hpc.runtime.checkpoint.tiers): hpc saves the training state there
    every ``every`` optimizer steps, beside training (the loop is held only for the copy), and keeps each node's
    part on ``replicas - 1`` other nodes too. Besides the script's save_state and the stop signal's, the shared tier
    gets the fast tier's newest checkpoint in the background every ``drain_steps`` steps or ``drain_minutes``
    minutes (0: neither)."""

    enabled: bool = False
    # a node-local folder in memory; hpc makes a private folder per user and job inside it, removed at the job's end
    directory: str = checked(checks.absolute_folder, default="/dev/shm")
    every: int = checked(checks.positive, default=1)
    replicas: int = checked(checks.fast_tier_replicas, default=2)
    drain_steps: int = checked(checks.non_negative, default=0)
    drain_minutes: float = checked(checks.non_negative_number, default=0.0)
    # copy the weights and optimizer state beside the next forward and backward (the optimizer's step waits for it)
    # instead of holding the loop for it; a script that changes weights in place before the step through .data
    # would go unseen (tiers/deferred_copy.py), hence off unless asked for
    overlap_copy: bool = False


# hpc's defaults for torchrun's c10d rendezvous (torch's own: join 600, last call 30, keep-alive 5 s x 3): a lost
# node costs seconds, not the ~45 s of torch's. Whole seconds: torch reads each with int().
RDZV_JOIN_TIMEOUT = 600
RDZV_LAST_CALL_TIMEOUT = 3
RDZV_KEEP_ALIVE_INTERVAL = 1
RDZV_KEEP_ALIVE_MAX_ATTEMPT = 3


@record
class Rendezvous(ReprByFields):
    """An elastic torchrun job's c10d rendezvous (torchrun --rdzv_conf), in whole seconds. A node is taken for dead
    once its agent's heartbeat is ``keep_alive_interval * keep_alive_max_attempt`` s old; a new round, once it has
    the job's MIN nodes, waits ``last_call_timeout`` s more for others (it starts at once with MAX); a node gives up
    joining after ``join_timeout`` s. These are the jobs' defaults (job keys ``rdzv_*``)."""

    join_timeout: int = checked(checks.positive, default=RDZV_JOIN_TIMEOUT)
    last_call_timeout: int = checked(checks.positive, default=RDZV_LAST_CALL_TIMEOUT)
    keep_alive_interval: int = checked(checks.positive, default=RDZV_KEEP_ALIVE_INTERVAL)
    keep_alive_max_attempt: int = checked(checks.positive, default=RDZV_KEEP_ALIVE_MAX_ATTEMPT)

    def validate(self, source: str) -> None:
        # a round's last call must end before a node's join gives up, or no round with fewer than MAX nodes forms
        if self.last_call_timeout >= self.join_timeout:
            raise ConfigError(source, "rendezvous.last_call_timeout", self.last_call_timeout,
                              f"is not shorter than rendezvous.join_timeout ({self.join_timeout})",
                              "lower rendezvous.last_call_timeout or raise rendezvous.join_timeout")
