"""The fast tier as the run guard drives it: a save at the first batch after every ``every``-th step and at a stop
(before the shared tier's), the fallback to the shared tier, the resume choice across tiers, and the folder's
removal at the run's end (kept over a requeue: the next attempt on the same nodes reads it)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpc.errors import HpcError
from hpc.runtime.checkpoint.tiers import choice, replication
from hpc.runtime.checkpoint.tiers.fast_tier import EXIT_WAIT_S, FastTier, drop
from hpc.runtime.checkpoint.tiers.node_store import NodeStore, job_key, slurm_running
from hpc.runtime.process import collectives
from hpc.runtime.process.process_state import ProcessState
from hpc.runtime.resilience.training_checkpoints import TrainingCheckpoints


class FastSaves:
    def __init__(self, process: ProcessState, checkpoints: TrainingCheckpoints, in_job: bool):
        self.process, self.checkpoints = process, checkpoints
        self.fast: FastTier | None = None
        self.on_drained: Callable[[int, Path], None] | None = None  # the run guard's note of a drained step
        self._fetch_group = None
        settings = checkpoints.options.fast_tier
        if settings is None or not in_job:
            return
        job = job_key()
        node = NodeStore(settings.directory, job)
        problem = None
        try:
            node.open()
            if process.is_local_main_process:  # another job's folder, left by a kill: its memory back to the node
                node.sweep(slurm_running)
        except (HpcError, OSError) as e:
            problem = f"{e}"
        # on every rank or on none: its saves and the resume choice are collectives
        problems = [p for p in collectives.gather_object_across(problem, process.world_size) if p]
        if problems:
            self._say(f"fast tier off: {problems[0]}")
            return
        fmt = checkpoints.checkpointer.format
        self.fast = FastTier(node, process.rank, process.world_size, process.env.local_world_size,
                             checkpoints.training, checkpoints.precision, checkpoints.strategy, settings, job,
                             local_rank=process.local_rank,
                             shards=fmt if hasattr(fmt, "local_state") else None)
        self._drained_step, self._drained_at = 0, time.monotonic()
        if process.is_main_process:
            self.fast.drained = self._drained
        if self.fast.shards is not None and (settings.drain_steps or settings.drain_minutes):
            self._say("fast tier: drain_steps/drain_minutes are not used for a sharded model: its shared-tier "
                      "checkpoints are the script's save_state and the one at a stop (DCP's, which reshard, "
                      "or DeepSpeed's)")

    @property
    def on(self) -> bool:
        return self.fast is not None and self.fast.off is None

    def _say(self, line: str) -> None:
        if self.process.is_main_process:
            print(f"hpc: {line}", file=sys.stderr, flush=True)

    def step_boundary(self, save_shared: Callable[[str], None], stopping: bool = False) -> None:
        """Every rank, at the same point: save to the fast tier if due (or ``stopping``: this step, now, before the
        shared tier's save). ``save_shared(reason)``: the shared tier's save when the fast tier has just failed."""
        fast = self.fast
        if fast is None or fast.off is not None:
            return
        step = self.checkpoints.training.completed_steps
        if not (fast.due(step) or (stopping and step != fast._last_step and step > 0)):
            if stopping:
                fast.wait()
            return
        fast.wait()
        if fast.fallback_due:
            save_shared(fast.fell_back())
            return
        # a sharded model's folders are no shared-tier checkpoint (that one is DCP's or DeepSpeed's): not drained
        fast.save(step, self.checkpoints.meta(), drain_into=self._drain_into(step) if fast.shards is None else None)
        if stopping:
            fast.wait()

    def _drain_into(self, step: int) -> Path | None:
        """The shared tier's folder for this step. Rank 0 gets it when a drain is due (``drain_steps`` steps or
        ``drain_minutes`` since the last: the replicated state is whole in its folder); every other rank always
        (its part goes there if rank 0 says in the save's vote that it drained: the minutes are rank 0's clock)."""
        settings = self.fast.settings
        if not (settings.drain_steps or settings.drain_minutes):
            return None
        if not self.process.is_main_process:
            return self.checkpoints.checkpointer.store.step_dir(step)
        due = (settings.drain_steps and step - self._drained_step >= settings.drain_steps) or (
            settings.drain_minutes and time.monotonic() - self._drained_at >= 60 * settings.drain_minutes)
        if not due:
            return None
        self._drained_step, self._drained_at = step, time.monotonic()
        return self.checkpoints.checkpointer.store.step_dir(step)

    def _drained(self, step: int, folder: Path) -> None:
        """On the writer thread: the shared tier has this step now (the timeline's save line; the job's progress;
        the shared store keeps its newest few)."""
        if self.on_drained is not None:
            self.on_drained(step, folder)
        self.checkpoints.checkpointer.store.purge(background=False)

    def progress(self, final: bool = False) -> dict:
        """The progress line's ``fast`` field; ``final`` (the run's last line): nothing when no save came since."""
        if self.fast is None or (final and self.fast.saves.n == 0):
            return {}
        return {"fast": self.fast.take_saves()}

    def choose(self) -> choice.Choice | None:
        """The fast tier's checkpoint to resume from when it is as new as the shared tier's or newer, else None
        (every rank the same answer)."""
        if self.fast is None:
            return None
        world, node = self.process.world_size, self.fast.node
        picked = choice.choose(node, self.fast.job, self.process.rank,
                               lambda obj: collectives.gather_object_across(obj, world), world, self._fetch,
                               layout=self.fast.layout())
        if picked is None:
            return None
        shared = self.checkpoints.checkpointer.store.committed() if self.process.is_main_process else None
        newest_shared = collectives.gather_object_across(shared[0].step if shared else None, world)[0]
        return picked if newest_shared is None or picked.step >= newest_shared else None

    def _fetch(self, step: int, moves: list, folder_of) -> dict[int, Path]:
        """A resume's transfers of fast-tier folders between ranks (every rank, the same moves): what this rank
        received ({saved rank: folder}), committed as peer copies on its node."""
        node = self.fast.node
        if self._fetch_group is None:  # one group for the resume's rounds (every rank makes it at the same call)
            self._fetch_group = replication.make_group()
        try:
            return replication.transfer(self._fetch_group, self.process.rank, moves, folder_of,
                                        lambda s, saved: node.store("peer", saved).step_dir(s))
        except Exception as e:  # noqa: BLE001 - a holder gone, the group's timeout: this step is not read
            print(f"hpc: rank {self.process.rank}: fetching fast-tier folders of step {step} failed: "
                  f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
            self._fetch_group = None  # sends left unmatched must not meet the next round's receives
            return {}

    def settle(self, step: int) -> None:
        """After a resume at ``step`` (0: none), every rank done loading: this node keeps what the run goes on
        from, its own ranks' folders and the copies of the previous node's ranks, none later than ``step``. A later
        one belongs to a run history left behind (a damaged newer folder must not let an older trajectory's be
        chosen next time); a copy of one of this node's own ranks (sent at this resume, or left by another layout of
        ranks) is no copy another node's loss could need, and only takes memory."""
        fast = self.fast
        if fast is None:
            return
        self.process.barrier()
        if not self.process.is_local_main_process:
            return
        mine = set(range(fast.writer, fast.writer + fast.local_world))
        sources = {(r - fast.local_world) % fast.world for r in mine} if fast.world > fast.local_world else set()
        for kind, saved, store in fast.node.holdings():
            keep = saved in (mine if kind == "own" else sources)
            for entry in store.entries():
                if not keep or entry.step > step:
                    drop(entry.path)

    def close(self, remove: bool) -> None:
        """The run is over; ``remove`` (not a requeue): the node's copy goes once every rank is done with it."""
        if self.fast is None:
            return
        self.fast.wait(EXIT_WAIT_S)
        if remove:
            self.process.barrier()
            if self.process.is_local_main_process:
                self.fast.node.remove()
        self.fast.close(remove=False)
