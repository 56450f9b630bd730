"""``BatchInference``: run a model over many items in a job that may be preempted, requeued or resubmitted,
and end with each item's output written exactly once.

    job = BatchInference("out/scores", num_items=len(texts), chunk_size=256)
    for chunk in job:                        # this rank's chunks that no earlier attempt committed
        chunk.commit([score(texts[i]) for i in chunk.indices])
    job.finish()                             # every chunk of this rank committed; the manifest once all are

The items are cut into fixed chunks; array tasks and ranks share them (sharding.py). A chunk's outputs are
written whole and then committed (chunk_files.py); an attempt starts by skipping every committed chunk, so work
lost to a stop is at most the chunks in flight, and nothing is written twice. A stop (the warning signal,
preemption, scancel) is noticed between chunks: the rank asks for a requeue where one is due and exits.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from hpc.contract import batch_outputs as names
from hpc.contract.atomic import atomic_write
from hpc.contract.runtime_config import current_config
from hpc.errors import HpcError
from hpc.runtime.inference.batch import chunk_files, sharding
from hpc.runtime.inference.batch.progress import Progress
from hpc.runtime.process.state import PartialState
from hpc.runtime.resilience import preemption, progress_guard
from hpc.runtime.resilience.run_guard import requeue_signals


@dataclass
class Chunk:
    """Items ``indices`` of the job; ``commit(outputs)`` writes their outputs (one per item, in order)."""

    number: int
    indices: range
    _job: BatchInference = field(repr=False)
    committed: bool = False

    def commit(self, outputs) -> None:
        self._job._commit(self, list(outputs))


class BatchInference:
    def __init__(self, output_dir: str | os.PathLike, num_items: int, chunk_size: int = 256, format: str = "jsonl",
                 *, task: int | None = None, num_tasks: int | None = None):
        self.spec = names.checked_spec(num_items, chunk_size, format)
        self.output = Path(output_dir).absolute()
        self.place = sharding.array_place(task, num_tasks)
        state = PartialState()
        self.rank, self.world = state.process_index, state.num_processes
        config = current_config()
        signal_name = config.preemption.signal if config else "USR1"
        self.max_requeues = config.preemption.max_requeues if config else None
        self.watch = preemption.PreemptionWatch(requeue_signals(signal_name), os.environ.get("HPC_STOP_FILE"))
        self.watch.install(term=True)  # this loop checks between chunks: TERM too is a stop at the next boundary
        pending, self.attempt = self._start()
        self.mine = sharding.deal(pending, self.rank, self.world)
        self.progress = Progress(self.attempt, self.rank)
        self._uncommitted: list[Chunk] = []

    # --- the attempt's start: every rank gets the same view of what is left ---------------------------
    def _start(self) -> tuple[list[int], str]:
        shared = [None]
        if self.rank == 0:
            shared[0] = self._take_stock()
        if self.world > 1 and dist.is_available() and dist.is_initialized():
            dist.broadcast_object_list(shared, src=0)
        elif self.world > 1:
            raise HpcError(f"BatchInference on rank {self.rank} of {self.world} without a process group",
                           fix="create the Accelerator or PartialState with the job's ranks first")
        if isinstance(shared[0], str):  # rank 0's refusal, said on every rank
            raise HpcError(shared[0], fix="use an output_dir of its own, or the settings it was started with")
        return shared[0]

    def _take_stock(self) -> tuple[list[int], str] | str:
        """Rank 0: the shape checked against an earlier run's, and the task's chunks not committed yet."""
        (self.output / names.CHUNKS).mkdir(parents=True, exist_ok=True)
        try:
            earlier = names.read_spec(self.output)
        except HpcError as e:
            return str(e)
        if earlier is None:
            atomic_write(self.output / names.SPEC, json.dumps(self.spec.as_dict()) + "\n", fsync=True)
        elif earlier != self.spec:
            return (f"{self.output} was started with {_shape(earlier)}; this run asks for {_shape(self.spec)}: "
                    f"its committed outputs would not line up")
        owned = [c for c in range(self.spec.num_chunks) if self.place.owns(c)]
        done = names.committed(self.output, self.spec, only=self.place.owns)
        attempt = secrets.token_hex(6)
        progress = Progress(attempt, 0)
        progress.start(names.items_done(self.spec, done), names.items_done(self.spec, owned))
        return [c for c in owned if c not in done], attempt

    # --- the loop -------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Chunk]:
        for number in self.mine:
            self._stop_if_asked()
            chunk = Chunk(number, self.spec.items_of(number), self)
            self._uncommitted.append(chunk)
            yield chunk
        self._stop_if_asked()

    def __len__(self) -> int:
        return len(self.mine)

    def _commit(self, chunk: Chunk, outputs: list) -> None:
        if chunk.committed:
            raise HpcError(f"chunk {chunk.number} was committed already", fix="commit each chunk once")
        try:
            chunk_files.commit(self.output, self.spec, chunk.number, outputs, self.attempt, self.rank)
        except OSError as e:
            raise HpcError(f"cannot write chunk {chunk.number} under {self.output}: {e.strerror or e}",
                           fix="free space or fix the folder's permissions; committed chunks are kept") from None
        chunk.committed = True
        progress_guard.note_done()  # this attempt did new work: a requeue is no endless loop (once per attempt)
        self.progress.add(len(chunk.indices))

    def finish(self) -> dict:
        """After the loop: fails loudly if a chunk of this rank's was left uncommitted; writes the manifest if the
        whole output is now committed. Returns {"items_done", "num_items", "complete"} of the whole output."""
        left = [c.number for c in self._uncommitted if not c.committed]
        if left or len(self._uncommitted) < len(self.mine):
            left += self.mine[len(self._uncommitted):]
            raise HpcError(f"rank {self.rank} left {len(left)} chunk(s) uncommitted (first: {left[0]})",
                           fix="call chunk.commit(outputs) for every chunk the loop yields")
        self.progress.add(0, final=True)
        commits = names.committed(self.output, self.spec)
        complete = len(commits) == self.spec.num_chunks
        if complete and not (self.output / names.MANIFEST).exists():
            chunk_files.write_manifest(self.output, self.spec, commits)
        return {"items_done": names.items_done(self.spec, commits), "num_items": self.spec.num_items,
                "complete": complete}

    # --- stopping -------------------------------------------------------------------------------------
    def _stop_if_asked(self) -> None:
        code = self.watch.local_code()
        if not code:
            return
        why = self.watch.received
        self.progress.add(0, final=True)
        preempted = code == preemption.STOP and preemption.preempted_without_job_script()
        requeued, said = False, "exiting"
        if code == preemption.REQUEUE or preempted:
            # a job script requeues once its ranks are gone, asked by any of them; SLURM's own command is asked
            # by rank 0 alone (a function job), so the job is requeued once
            if preemption.job_script_requeues() or self.rank == 0:
                requeued, said = preemption.requeue(None if preempted else self.max_requeues, f"{why} signal")
            else:
                requeued, said = True, "rank 0 asks for the requeue"
        left = len(self.mine) - sum(c.committed for c in self._uncommitted)
        preemption.log(f"stop requested ({why}) on rank {self.rank}: committed chunks kept, {left} of its "
                       f"{len(self.mine)} left for the next attempt; {said}")
        sys.exit(0 if requeued else 128 + (signal.SIGTERM if code == preemption.STOP
                                           else getattr(signal, f"SIG{self.watch.requeue_signals[0]}")))


def _shape(spec: names.BatchSpec) -> str:
    return f"num_items={spec.num_items}, chunk_size={spec.chunk_size}, format={spec.format!r}"
