"""The fast tier: hpc's own checkpoint in node memory every ``every`` steps, beside training.

On the training thread, at the first batch after a step (the step is over, scheduler and script included), the
state is copied into reused host buffers (the only time the loop is held); a thread then writes the copy in the
checkpointer's format (checksummed files, manifest.json last: checkpointer.py's commit rules), sends it to the
peer node (replication.py) and purges the older ones. The replicated state (a DDP model is the same on every rank)
is written once a node, by its first local rank, beside that rank's random streams and stream readers; every other
rank's folder holds its own streams and readers only (format "part", naming the rank whose folder holds the rest),
so a node of 8 ranks keeps one copy of the model and optimizer, not 8;
a drain into the shared tier copies rank 0's folder and every other rank's streams and readers beside it. A sharded
model (FSDP) has every rank write its own shards (format "shard", checkpoint/local_shards.py), not drained;
DeepSpeed's engine writes each rank's own files there itself (format "shard" too: its save is collective, so it
runs on the training thread, into node memory; the thread checksums, commits and sends them).

A save that does not fit (the tier's free memory below what it needs) or that fails writing turns the tier off for
the rest of the run: every rank learns it at the next save (one all-reduce in the thread), the run guard saves to
the shared tier instead, and one line says why. The job never fails for the fast tier.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from hpc.runtime.checkpoint import fileset, manifest
from hpc.runtime.checkpoint.fileset import FileSet
from hpc.runtime.checkpoint.formats import StagingBuffers
from hpc.runtime.checkpoint.tiers import memory_headroom
from hpc.runtime.checkpoint.tiers.deferred_copy import DeferredCopy
from hpc.runtime.checkpoint.tiers.node_store import NodeStore
from hpc.runtime.checkpoint.tiers.replication import Replication
from hpc.runtime.process.seed import rng_state


@dataclass
class Saves:
    """What the fast tier did since the last progress line (timeline ``progress.fast``)."""

    step: int | None = None  # the newest fast-committed step
    n: int = 0
    stall_s: float = 0.0
    # the writer thread's seconds at work (write, checksums, the copy to and from the peer): beside the loop, but
    # on the cores the loop may need (a CPU-bound job's steps slow down by up to this)
    busy_s: float = 0.0
    replicas: int = 0  # nodes holding the newest one
    bytes: int = 0  # the newest one's files (rank 0's: the replicated state), for `hpc submit`'s check next time

    def take(self) -> dict:
        out = {"step": self.step, "n": self.n, "stall_s": round(self.stall_s, 4), "busy_s": round(self.busy_s, 4),
               "replicas": self.replicas, "bytes": self.bytes}
        self.n, self.stall_s, self.busy_s = 0, 0.0, 0.0
        return out


class FastTier:
    """One rank's fast tier. ``strategy``: unwraps models; ``settings``: the profile's FastTier; ``meta()``: what
    a checkpoint records of the loop (TrainingCheckpoints' meta)."""

    def __init__(self, node: NodeStore, rank: int, world: int, local_world: int, training, precision, strategy,
                 settings, job: str, local_rank: int = 0, shards=None):
        self.node, self.rank, self.world, self.local_world = node, rank, world, local_world
        # a sharded model (FSDP): ``shards`` is its checkpoint format, which gives each rank's own shards; every
        # rank's folder then holds its part of the model and optimizer (format "shard"), nothing is replicated
        self.shards = shards
        # the rank whose folder holds this node's copy of the replicated state: ranks are numbered node by node (as
        # srun's block distribution and torchrun number them; replication's next-node rule assumes it too)
        self.writer = rank if shards is not None else rank - local_rank
        self.training, self.precision, self.strategy, self.settings = training, precision, strategy, settings
        self.job = job
        self.saves = Saves()
        self.off: str | None = None  # why the tier is off (a fallback), once it is
        self.fallback_due: str | None = None  # a failure every rank now knows of: the shared tier saves instead
        self.replication: Replication | None = None
        self._replication_made = False
        self._staging = StagingBuffers()
        # the weights' and optimizer state's copy, beside the next forward (the profile's overlap_copy)
        self._deferred = DeferredCopy(on=settings.overlap_copy)
        # one writer thread for the run, fed a save at a time: starting a thread per save costs the loop a wait
        # for it to be scheduled (tens of ms on a loaded node)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self._failed: str | None = None  # this rank's last save did not commit (why)
        self.drained = None  # (step, folder) -> None: a step drained into the shared tier (on the writer thread)
        self._last_step: int | None = None
        self._layout: str | None = None

    # --- saving ---------------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        return (self.off is None and step > 0 and step != self._last_step and step % self.settings.every == 0)

    def save(self, step: int, meta: dict, drain_into: Path | None = None) -> float:
        """Stage this step's state and write it in the background; returns the seconds the loop was held.
        ``drain_into``: the shared tier's folder of this step. Rank 0 drains its folder there when given one (a
        drain is due); any other rank writes its own part there (its random streams, its readers' positions) when
        rank 0 says, in the save's vote, that it drained this step."""
        started = time.monotonic()
        self.wait()  # one save in flight: the previous one is committed and replicated first
        if self.fallback_due or self.off:
            return time.monotonic() - started
        if not self._replication_made:  # every rank reaches its first save at the same step: the group is made here
            self._replication_made = True
            self.replication = Replication.make(self.rank, self.world, self.local_world, self.settings.replicas > 1)
        self._last_step = step
        staged = self._stage()
        written = getattr(self.shards, "write_local", None)  # DeepSpeed: the engine writes its own files
        # this rank's folder and the copy of the previous node's rank it keeps (each about as big); a sharded model's
        # every rank of the node writes as much at once into the same memory
        need = (_bytes(staged) + (self.shards.local_bytes() if written else 0)) * (2 if self.copies else 1) * (
            self.local_world if self.shards is not None else 1)
        free = self.node.free_bytes()  # the oldest kept folder goes only once this one has committed
        room = memory_headroom.headroom()  # tmpfs pages count against the job's memory limit
        if need > free:
            self._failed = (f"the fast tier {self.node.base} has {_size(free)} free, a save needs {_size(need)} "
                            "(out of node memory)")
            staged = None
        elif room is not None and need + HEADROOM_KEPT > room:
            self._failed = (f"the job's memory limit leaves {_size(max(room, 0))}, a save needs {_size(need)} and "
                            f"training {_size(HEADROOM_KEPT)} beside it (tmpfs pages count against the limit: "
                            "the kernel would kill the job)")
            staged = None
        files = self._write_files(step, staged is not None) if written is not None else None
        if written is not None and files is None:
            staged = None
        kind = manifest.SHARD if self.shards is not None else "full" if self.whole else manifest.PART
        if self.shards is not None:
            meta = {**meta, "layout": self.layout()}
        meta = {**meta, "world_size": self.world, "format": kind, "rank": self.rank,
                "whole_in": self.writer, "job": self.job, "uid": self.node.uid}
        self._idle.clear()
        if self._thread is None:
            self._thread = threading.Thread(target=_serve, args=(weakref.ref(self), self._jobs), name="hpc-fast-tier",
                                            daemon=True)  # a node lost mid-send must not hold the process's exit
            self._thread.start()
            _tiers.add(self)
        self._jobs.put((step, staged, meta, drain_into, files))
        stall = time.monotonic() - started
        self.saves.n += 1
        self.saves.stall_s += stall
        return stall

    def layout(self) -> str | None:
        """A sharded model's layout (local_shards.layout), worked out once; None for replicated state."""
        if self.shards is None:
            return None
        if self._layout is None:
            self._layout = self.shards.local_layout(self.training.models, self.training.optimizers)
        return self._layout

    @property
    def whole(self) -> bool:
        """Whether this rank writes the replicated state (its node's first local rank), or its own part only."""
        return self.rank == self.writer

    def _stage(self) -> dict:
        """The state as the checkpointer names its files, copied where training cannot change it."""
        training, rank = self.training, self.rank
        state = {}
        if self.shards is not None:
            state = self.shards.local_state(training.models, training.optimizers)
        elif self.whole:
            state = {f"model_{i}.pt": self.strategy.unwrap(m).state_dict() for i, m in enumerate(training.models)}
            state.update({f"optimizer_{i}.pt": o.state_dict() for i, o in enumerate(training.optimizers)})
        if self.whole:
            state.update({f"scheduler_{i}.pt": s.state_dict() for i, s in enumerate(training.schedulers)})
            state.update({f"custom_{i}.pt": o.state_dict() for i, o in enumerate(training.custom_objects)})
            if self.precision.scaler is not None:
                state["scaler.pt"] = self.precision.scaler.state_dict()
        state[f"rng/rank{rank}.pt"] = rng_state()
        readers = [dl.state_dict().get("reader") for dl in training.loaders]
        if any(r is not None for r in readers):
            state[f"loaders/rank{rank}.pt"] = readers
        deferred = self._deferred
        sources = deferred.sources([self.strategy.unwrap(m) for m in training.models],
                                   training.optimizers) if self.whole and self.shards is None else set()
        later = (lambda t, buf: t.data_ptr() in sources and (deferred.defer(t, buf) or True)) if sources else None
        staged = self._staging.copy(state, "fast", later)
        self._staging.synchronize()
        if sources:
            deferred.guard(training.optimizers)
        return staged

    def take_saves(self) -> dict:
        """The saves since the last progress line, the loop's waits for deferred copies counted in their stall."""
        self.saves.stall_s += self._deferred.take_waited()
        return self.saves.take()

    def _write_files(self, step: int, fits: bool) -> Path | None:
        """The engine's own files of this step, written now into a folder beside the store's (committed by the
        thread); None, with the reason kept, where any rank's memory lacks the room (the write is collective:
        every rank writes or none) or the write failed."""
        import torch
        import torch.distributed as dist

        everyone = torch.tensor([int(fits)], device=self.strategy.state.device)
        dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
        if not everyone.item():
            self._failed = self._failed or "another rank's node memory has no room for the fast tier's save"
            return None
        store = self.node.store("own", self.rank)
        files = store.step_dir(step).with_name(f"{_WRITING}{step}")
        for left in store.root.glob(f"{_WRITING}*"):  # a write a crash cut short: its memory back
            shutil.rmtree(left, ignore_errors=True)
        try:
            files.mkdir(parents=True, mode=0o700)
            self.shards.write_local(files)
        except OSError as e:  # ENOSPC above all, in the engine's writes, which lie between its two barriers:
            dist.barrier()  # the other ranks wait at the second for this one
            shutil.rmtree(files, ignore_errors=True)
            self._failed = f"writing {files} failed: {e.strerror or e} (out of node memory?)"
            return None
        return files

    def _write(self, step: int, staged: dict | None, meta: dict, drain_into: Path | None = None,
               files: Path | None = None) -> None:
        started = time.monotonic()
        try:
            self._write_and_send(step, staged, meta, drain_into, files)
        finally:
            self.saves.busy_s += time.monotonic() - started
            self._idle.set()

    def _write_and_send(self, step: int, staged: dict | None, meta: dict, drain_into: Path | None,
                        written: Path | None = None) -> None:
        folder, drained = None, False
        try:  # whatever fails here, this rank still takes part in the exchange and the vote below, as the others do
            changed = self._deferred.land()
            if changed is not None:
                self._deferred.on = False
                staged = None
                print(f"hpc: rank {self.rank}: the fast tier's save of step {step} is dropped: {changed}; "
                      "its copies are taken on the training thread from now on", file=sys.stderr, flush=True)
            if staged is not None:
                folder = self._commit(step, staged, meta, written)
            drained = self.rank == 0 and folder is not None and drain_into is not None and self._drain(folder,
                                                                                                      drain_into)
        except Exception as e:  # noqa: BLE001 - a pickling error, a copy into a buffer of another shape, ...
            folder, drained = None, False
            self._failed = self._failed or f"the fast tier's save of step {step} failed: {type(e).__name__}: {e}"
        failed = self._failed is not None
        if self.copies:
            try:
                copy, kept = self.replication.exchange(folder, lambda s, saved: _fresh_dir(self.node.store(
                    "peer", saved), s))
                if copy is not None:
                    self.node.store("peer", self.replication.source).purge()
                self.saves.replicas = int(folder is not None) + int(kept)
                failed, drained = self.replication.vote(failed, drained)
            except Exception as e:  # noqa: BLE001 - a peer lost mid-exchange: this save stays on this node only
                self.saves.replicas = int(folder is not None)
                self._failed = self._failed or f"the copy to the peer node failed: {e}"
                failed = True
        else:
            self.saves.replicas = int(folder is not None)
            if self.replication is not None:
                failed, drained = self.replication.vote(failed, drained)
        if drained and self.rank != 0 and folder is not None and drain_into is not None:
            self._drain_part(folder, drain_into)
        if folder is not None:
            self.saves.step = step
        if failed:
            self.fallback_due = self._failed or "another rank's fast tier is full or failed"

    def _commit(self, step: int, staged: dict, meta: dict, written: Path | None = None) -> Path | None:
        """``written``: a folder of files a library wrote for this step (DeepSpeed's), moved in and checksummed."""
        store = self.node.store("own", self.rank)
        folder = store.step_dir(step)
        try:
            _fresh_dir(store, step)
            if folder.exists():
                shutil.rmtree(folder)
            if written is not None:
                written.rename(folder)  # the same memory: a rename, no copy
            else:
                folder.mkdir(parents=True, mode=0o700)
            files = FileSet(folder, self.rank)
            for name, obj in staged.items():
                files.save(name, obj)
            if written is not None:
                files.claim(self.shards.local_files)
                files.hash_claimed()
            manifest.commit(folder, files.sums, meta, fsync=False)
        except OSError as e:  # ENOSPC above all: a full tmpfs
            shutil.rmtree(folder, ignore_errors=True)
            self._failed = f"writing {folder} failed: {e.strerror or e} (out of node memory?)"
            return None
        self.saves.bytes = sum(int(v["size"]) for v in files.sums.values())
        store.purge()
        return folder

    def _drain(self, folder: Path, into: Path) -> bool:
        """Rank 0: the committed ``folder`` into the shared tier's step folder ``into``: every file, then its
        manifest last (the same sizes and checksums), renamed into place whole; a folder already there (the
        script's own save_state of this step) stands. ``drained(step, folder)`` hears of it; a failure is one
        line. Whether it drained (the other ranks then add their parts)."""
        work = into.with_name(f".{into.name}.draining")
        try:
            if into.exists():
                return False
            shutil.rmtree(work, ignore_errors=True)
            data = manifest.read(folder)
            for name in data["files"]:
                _copy_synced(folder / name, work / name)
            meta = {k: v for k, v in data.items() if k not in ("files", "version", "committed_at", "rank", "job",
                                                               "uid", "whole_in")}
            manifest.commit(work, data["files"], {**meta, "from": "node"}, fsync=True)
            work.rename(into)
        except OSError as e:
            shutil.rmtree(work, ignore_errors=True)
            print(f"hpc: the fast tier's step {folder.name} was not drained to {into.parent}: {e}", file=sys.stderr,
                  flush=True)
            return False
        if self.drained is not None:
            self.drained(int(data["step"]), into)
        return True

    def _drain_part(self, folder: Path, into: Path) -> None:
        """A rank other than 0, after rank 0 drained this step into ``into``: its own random streams and readers'
        positions beside rank 0's files, as the checkpointer keeps a rank's part of a replicated save (the files,
        then ``.rank<r>.json`` naming them with their checksums). A resume from the drained step then gives every
        rank its own streams back, as one from the fast tier does. A failure is one line: that rank would keep
        the streams its script seeded, and the resume says so."""
        try:
            data = manifest.read(folder)
            mine = {name: entry for name, entry in data["files"].items()
                    if name in (f"rng/rank{self.rank}.pt", f"loaders/rank{self.rank}.pt")}
            for name in mine:
                _copy_synced(folder / name, into / name)
            fileset.publish_part(into, self.rank, mine, fileset.point(data), fsync=True)
        except (OSError, TypeError) as e:
            print(f"hpc: rank {self.rank}'s part of the fast tier's step {folder.name} was not drained to "
                  f"{into}: {e}", file=sys.stderr, flush=True)

    @property
    def copies(self) -> bool:
        return self.replication is not None and self.replication.copies

    def wait(self, timeout: float | None = None) -> None:
        """On the training thread: the save in flight is judged (a deferred copy) and committed."""
        self._deferred.verify(timeout)
        self._idle.wait(timeout)

    def fell_back(self) -> str:
        """The shared tier takes over: the fast tier is off from here on. Returns the reason (said once)."""
        why, self.fallback_due = self.fallback_due or "", None
        self.off = why
        if self.rank == 0:
            print(f"hpc: fast tier off, checkpoints go to the shared tier: {why}", file=sys.stderr, flush=True)
        return why

    def close(self, remove: bool) -> None:
        """The run is over: the last save finishes; ``remove`` (the job's end, not a requeue) frees the memory.
        A save whose peer never saved the same step (a loop on one rank only after the last step) is not waited
        for beyond a few seconds: the writer is a daemon thread."""
        self.wait(EXIT_WAIT_S)
        self._deferred.close()
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
        if remove:
            self.node.remove()


def _serve(tier_ref, jobs: queue.SimpleQueue) -> None:
    """The writer thread: one save after the other; it ends with its tier (None is put by close)."""
    while (job := jobs.get()) is not None:
        tier = tier_ref()
        if tier is None:
            return
        try:
            tier._write(*job)
        except Exception as e:  # noqa: BLE001 - the vote's group broke (a peer died): the shared tier takes over
            tier.fallback_due = tier.fallback_due or f"the fast tier's writer failed: {type(e).__name__}: {e}"
        del tier


# the tiers whose save may be in flight as the process exits (an exit without end_training): given a few seconds to
# commit and reach the peer (milliseconds when both ends are alive). After an exception (a collective that failed
# because a node died) the peer is likely gone and the survivors' restart waits on this exit: a second at most. A
# save cut short is never read: its manifest is written last.
_tiers: weakref.WeakSet = weakref.WeakSet()
_WRITING = ".writing-step-"  # a folder the engine writes into, renamed to its step's folder once committed
HEADROOM_KEPT = 256 << 20  # what training keeps of the job's memory limit beside a save (its next step's growth)
EXIT_WAIT_S = 5.0
EXIT_WAIT_AFTER_ERROR_S = 1.0


@atexit.register
def _finish_in_flight() -> None:
    import sys

    wait = EXIT_WAIT_AFTER_ERROR_S if getattr(sys, "last_value", None) is not None else EXIT_WAIT_S
    for tier in list(_tiers):
        tier.wait(wait)


def _fresh_dir(store, step: int) -> Path:
    """Where ``step`` is saved in ``store``, once the folders of later steps are gone: a run that resumed from an
    older step (the shared tier's, when not every rank's folder was held) left the trajectory they belong to, and
    the store's purge, which keeps the newest, would otherwise take this save for the old one and remove it."""
    for entry in store.entries():
        if entry.step > step:
            drop(entry.path)
    return store.step_dir(step)


def drop(folder: Path) -> None:
    (folder / manifest.NAME).unlink(missing_ok=True)  # uncommitted first: never half there
    shutil.rmtree(folder, ignore_errors=True)


def _copy_synced(source: Path, target: Path) -> None:
    """A file copied onto the shared filesystem and on its disk before anything names it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    with open(target, "rb") as f:
        os.fsync(f.fileno())


def _bytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_bytes(v) for v in obj)
    return 64


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
