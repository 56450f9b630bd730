"""save_state / load_state: the whole training state, committed atomically, optionally in the background.

Sharded state (FSDP, DeepSpeed) is saved together: every rank writes its own files and publishes their
checksums; rank 0 merges them into the manifest and renames it into place last. Replicated state (one process,
DDP) is saved by each rank alone, with no collective, as Accelerate does (scripts call save_state inside
`if accelerator.is_main_process:`): rank 0 writes and commits the whole state, every other rank its own part
(its RNG) beside it (fileset.py). Nothing reads a folder without a manifest, and nothing loads a file whose
size or checksum differs from it (nor one whose manifest is malformed): the newest good checkpoint is used,
with a one-line note for each one skipped. A damaged step folder is saved again when training reaches its step,
and does not count among the checkpoints kept. Nothing is unpickled (safe_load.py).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

from hpc.errors import HpcError
from hpc.runtime.checkpoint import fileset, manifest, notices, safe_load
from hpc.runtime.checkpoint.fileset import FileSet
from hpc.runtime.checkpoint.formats import StagingBuffers
from hpc.runtime.checkpoint.store import CheckpointStore
from hpc.runtime.precision import Precision
from hpc.runtime.process import collectives
from hpc.runtime.process.process_state import ProcessState
from hpc.runtime.process.seed import old_numpy_globals, rng_state, set_rng_state
from hpc.runtime.process.training_state import TrainingState

COMMIT_TIMEOUT_S = 1800.0  # how long rank 0 waits for the other ranks' files before giving the save up
# how long a rank waits for the others to enter a sharded save or load before it names the script's mistake
ARRIVAL_TIMEOUT_S = 600.0
# how long a rank that saved its part waits for rank 0 to say where it saved the same point (a replicated save)
ANNOUNCE_TIMEOUT_S = 120.0


class Checkpointer:
    """``process``: this rank's facts and plain collectives (its barrier casts no stop vote: a save is not a point
    of the training loop). ``states``: what is saved and restored (models, optimizers, schedulers, loaders,
    registered objects); ``precision``: the fp16 loss scaler, where there is one."""

    def __init__(self, process: ProcessState, states: TrainingState, precision: Precision, fmt,
                 store: CheckpointStore, fsync: bool = False, arrival_timeout_s: float = ARRIVAL_TIMEOUT_S):
        self.process, self.states, self.precision = process, states, precision
        self.format, self.store, self.fsync = fmt, store, fsync
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._staging = StagingBuffers()  # reused by every background save (one is in flight at a time)
        self.alone = bool(getattr(fmt, "replicated", False))  # each rank saves and loads without the others
        self._own_part_folder: Path | None = None  # where the checkpoint being loaded keeps this rank's part
        self._arrivals = notices.Arrivals(process.world_size, arrival_timeout_s)
        self._saved_points: set[tuple] = set()  # (step, micro_step) this process saved a part of (replicated)
        # what this process knows of the store's folders, alike on every rank (choose and sharded saves run
        # together): damaged (why), or verified or written here; a damaged one is saved again, never kept
        self._damaged: dict[Path, str] = {}
        self._good: set[Path] = set()
        # what this rank found reading every file of a folder alone (newest_good_step): reused by choose
        self._read_alone: dict[Path, str | None] = {}
        self._newest_good: tuple[int | None] | None = None

    def committed_step(self, folder: Path) -> int | None:
        """The step of the checkpoint committed in ``folder`` (after this rank's own save in flight), or None."""
        self.wait()
        data = manifest.read(Path(folder))
        if data is None or "step" not in data or manifest.malformed(data):
            return None
        return int(data["step"])

    def newest_good_step(self) -> int | None:
        """The step of the newest committed checkpoint that verifies (what a resume would load), or None; found by
        this rank alone, with no collective (a property may be read on one rank only): each rank that asks
        reads every file itself, so ranks agree, and the answer is kept (choose does not read them again)."""
        if self._newest_good is None:
            def skipped(entry, problem: str) -> None:
                self._read_alone[entry.path] = problem

            good = self.store.newest_good(skipped)
            if good is not None:
                self._read_alone[good.path] = None
            self._newest_good = (good.step if good is not None else None,)
        return self._newest_good[0]

    def arrive(self, what: str) -> None:
        """Sharded state: wait for every rank to enter this save or load (a clear error if one never does)."""
        if not self.alone:
            self._arrivals.wait(what, fix=f"call {what} on every rank, not under `if accelerator.is_main_process:`")

    @property
    def rank(self) -> int:
        return self.process.rank

    @property
    def world(self) -> int:
        return self.process.world_size

    def _barrier(self) -> None:
        self.process.barrier()

    def _all_gather(self, obj) -> list:
        return collectives.gather_object_across(obj, self.world)

    # --- saving -------------------------------------------------------------------------------------
    def wait(self) -> None:
        """Block until a background save has committed; re-raise what went wrong in it."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise HpcError(f"the background checkpoint save failed: {error}", fix="see the traceback above") \
                from error

    def save(self, folder: Path, meta: dict, async_save: bool = False, purge: bool = True,
             before_write=None) -> Path:
        """Write the training state into ``folder`` and commit it. A step folder of the store that is already
        committed and verifies holds this very state (the same step, saved again after a resume) and is kept.
        Any other committed folder (a damaged step folder, a script's save_state("latest") called again) is
        replaced whole: the new state is written beside it and swapped in once committed, so a crash mid-save
        leaves the old one in place (a damaged one is never taken for good: it does not verify).
        ``before_write(work_folder)`` runs on every rank once the folder exists (save_state's pre-hooks)."""
        self.wait()  # one save in flight: the next waits for the previous to commit
        folder = Path(folder)
        committed = manifest.read(folder) is not None
        if committed and folder.parent == self.store.root and self._saved_already(folder, meta):
            return folder
        if self.alone:
            return self._save_alone(folder, committed, meta, async_save, purge, before_write)
        work = _beside(folder, "saving") if committed else folder
        if self.rank == 0:
            if work.exists():  # left by a save that was cut short
                shutil.rmtree(work)
            work.mkdir(parents=True)
        self._barrier()
        staged, extras = self._stage(work, async_save, before_write)
        background = async_save and staged.background_ok

        def job() -> None:
            files = FileSet(work, self.rank, fsync=self.fsync)
            for name, obj in extras.items():
                files.save(name, obj)
            staged.write(work, files)
            files.finish()
            if self.rank == 0:
                self._commit(work, meta)
                if work != folder:
                    _swap_in(work, folder)
                if purge and folder.parent == self.store.root:
                    self._purge()

        self._run(job, background)
        if not background:
            self._barrier()  # every rank returns once the checkpoint is committed
        self._written(folder)
        return folder

    def _saved_already(self, folder: Path, meta: dict) -> bool:
        """A committed step folder of the store, saved again at its step (after a resume): whether it stands as
        it is. Sharded: all ranks decide together. Replicated: rank 0 for the shared state, each other rank for
        its own part."""
        if not self.alone:
            good = self._verified(folder)  # a collective when unknown: every rank is in this save
            if good:
                self._barrier()
            return good
        if self.rank == 0:
            return self._verified(folder)
        part = fileset.read_part(folder, self.rank)
        # this very step, saved again after a resume; else this rank's part is missing, stale or damaged
        return (folder not in self._damaged and part is not None and fileset.point(part) == fileset.point(meta)
                and manifest.verify(folder, part["files"]) is None)

    def _verified(self, folder: Path) -> bool:
        if folder in self._damaged:
            return False
        if folder not in self._good:
            self._judge(folder, self._damage(folder))
        return folder in self._good

    def _judge(self, folder: Path, problem: str | None) -> None:
        if problem:
            self._damaged[folder] = problem
            self._good.discard(folder)
        else:
            self._good.add(folder)
            self._damaged.pop(folder, None)

    def _written(self, folder: Path) -> None:
        """This process (every rank of a sharded save) has just written ``folder`` whole."""
        if folder.parent == self.store.root:
            self._judge(folder, None)

    def _purge(self) -> None:
        # the folders found damaged are not among the kept: the newest may be damaged too, and one before it
        # must be good
        self.store.purge(background=True, damaged=frozenset(self._damaged))

    def _save_alone(self, folder: Path, committed: bool, meta: dict, async_save: bool, purge: bool,
                    before_write) -> Path:
        """A replicated save with no collective: rank 0 writes the whole state and commits it, any other rank that
        calls writes its own part. Nobody waits for anybody; a rank that loads right after saving waits for rank
        0's commit of the same point (choose)."""
        at = fileset.point(meta)
        work = _beside(folder, "saving") if committed and self.rank == 0 else folder
        self._saved_points.add(at)
        if self.rank == 0:
            notices.announce(at, folder.absolute())
            notices.saving(True)  # the others train on and wait for rank 0 in their next collective
            if work != folder and work.exists():  # left by a replacement that was cut short
                shutil.rmtree(work)
        work.mkdir(parents=True, exist_ok=True)
        staged, extras = self._stage(work, async_save, before_write)

        def job() -> None:
            if self.rank != 0:
                fileset.write_part(work, self.rank, extras, staged, at, self.fsync, ANNOUNCE_TIMEOUT_S)
                return
            files = FileSet(work, self.rank, fsync=self.fsync)
            for name, obj in extras.items():
                files.save(name, obj)
            staged.write(work, files)
            try:
                manifest.commit(work, fileset.collect_alone(work, files.sums),
                                {"world_size": self.world, "format": self.format.name, **meta}, fsync=self.fsync)
                if work != folder:
                    _swap_in(work, folder, at)
            finally:
                notices.saving(False)
            if purge and folder.parent == self.store.root:
                self._purge()

        self._run(job, async_save and staged.background_ok)
        if self.rank == 0:
            self._written(folder)
        return folder

    def _stage(self, work: Path, async_save: bool, before_write) -> tuple:
        """The save's first half, on the training thread: the pre-hooks, then the state copied where it must be
        (what training changes next) and the collective planning started."""
        if before_write is not None:
            before_write(work)
        # GPU state goes through pinned host buffers even for a synchronous save: faster than the pageable
        # copies torch.save makes of each tensor
        buffers = self._staging if async_save or self.process.device.type == "cuda" else None
        staged = self.format.stage(self.states.models, self.states.optimizers, copy=buffers,
                                   background=async_save)
        extras = self._extras(buffers)
        staged.start(work)
        if buffers is not None:
            buffers.synchronize()
        return staged, extras

    def _run(self, job, background: bool) -> None:
        if not background:
            job()
            return

        def run() -> None:
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - handed to the training thread at wait()
                self._error = e

        self._thread = threading.Thread(target=run, name="hpc-checkpoint")  # not daemon: exit waits for it
        self._thread.start()

    def _extras(self, buffers: StagingBuffers | None) -> dict:
        states, scaler = self.states, self.precision.scaler
        out = {f"rng/rank{self.rank}.pt": rng_state()}
        readers = [dl.state_dict().get("reader") for dl in states.loaders]
        if any(r is not None for r in readers):  # a StatefulDataLoader's stream: where each rank's reader stands
            out[f"loaders/rank{self.rank}.pt"] = readers
        if self.rank == 0:
            for i, sched in enumerate(states.schedulers):
                out[f"scheduler_{i}.pt"] = sched.state_dict()
            if scaler is not None:
                out["scaler.pt"] = scaler.state_dict()
            for i, obj in enumerate(states.custom_objects):
                out[f"custom_{i}.pt"] = obj.state_dict()
        return buffers.copy(out, "extras") if buffers is not None else out

    def _commit(self, folder: Path, meta: dict) -> None:
        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        while (files := fileset.collect(folder, self.world)) is None:
            if time.monotonic() > deadline:
                raise HpcError(f"{folder}: not every rank finished its part of the checkpoint within "
                               f"{COMMIT_TIMEOUT_S:.0f} s; it stays uncommitted", fix="see the other ranks' logs")
            time.sleep(0.02)
        manifest.commit(folder, files, {"world_size": self.world, "format": self.format.name, **meta},
                        fsync=self.fsync)
        fileset.clear_sums(folder, self.world)

    # --- loading ------------------------------------------------------------------------------------
    def _settle(self, folder: Path) -> None:
        """A replacement cut short between its two renames: finish it (or roll it back) before reading."""
        if (self.rank == 0 or self.alone) and not folder.exists():
            saving, replaced = _beside(folder, "saving"), _beside(folder, "replaced")
            try:
                if manifest.read(saving) is not None:
                    saving.rename(folder)
                elif replaced.exists():
                    replaced.rename(folder)
            except OSError:  # another rank settled it first (replicated loads run on each rank alone)
                pass
        if not self.alone:
            self._barrier()

    def _damage(self, folder: Path, together: bool = False) -> str | None:
        """Sharded (or ``together``): checked by all ranks together, each a share of the files; the same answer
        on every rank. Replicated, one folder named: each rank checks every file it will read, alone."""
        alone = self.alone and not together
        data = manifest.read(folder)
        if together and folder in self._read_alone:  # this rank has read every file already
            mine = self._read_alone.pop(folder)
        elif data is None:
            mine = f"{folder}: no {manifest.NAME} (the save never finished)"
        else:
            mine = manifest.malformed(data, folder)
            if mine is None:
                names = sorted(data["files"]) if alone else sorted(data["files"])[self.rank::self.world]
                mine = manifest.verify(folder, data["files"], names)
        if alone:
            return mine
        problems = [p for p in self._all_gather(mine) if p]
        return problems[0] if problems else None

    def _shared_source(self, folder: Path) -> Path:
        """Replicated, on a rank other than 0 that saved its own part into ``folder``: the folder rank 0 saved the
        same point in (a script may name one folder per rank), once it is committed there."""
        part = fileset.read_part(folder, self.rank) if self.alone and self.rank != 0 else None
        if part is None:
            return folder
        at = fileset.point(part)
        data = manifest.read(folder)
        if at not in self._saved_points or (data is not None and fileset.point(data) == at):
            return folder  # committed already, or a part of another process's (one resuming never waits)
        shared = notices.where(at, timeout_s=ANNOUNCE_TIMEOUT_S)
        source = Path(shared) if shared else folder
        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        while True:
            data = manifest.read(source)
            if data is not None and fileset.point(data) == at:
                return source
            if shared is None or time.monotonic() > deadline:  # rank 0 never saved this point: what is there
                return source
            time.sleep(0.05)

    def choose(self, folder: Path | None) -> Path | None:
        """The explicit folder (damage is an error), or the newest good one in the store (None if none). The
        store's is chosen by all ranks together (resume() and auto-resume are reached by every rank): ranks that
        chose apart could load different steps."""
        self.wait()  # this rank's own save in flight commits first
        if folder is not None:
            self._settle(Path(folder))
            source = self._shared_source(Path(folder))
            if source != Path(folder):
                self._settle(source)
            problem = self._damage(source)
            if problem:
                raise HpcError(f"cannot load checkpoint: {problem}", fix="pick another step folder")
            self._own_part_folder = Path(folder)
            return source
        candidates = self._all_gather([e.path for e in self.store.committed()] if self.rank == 0 else None)[0]
        for path in candidates:
            problem = self._damage(path, together=True)
            self._judge(path, problem)
            if not problem:
                self._own_part_folder = path
                return path
            if self.rank == 0:
                print(f"hpc: skipping damaged checkpoint {path.name}: {problem}", file=sys.stderr, flush=True)
        return None

    def _own_part(self, data: dict) -> Path | None:
        """Replicated, rank other than 0: the folder holding this rank's part of the loaded point, checked; None
        (with a one-line note) where it is missing, of another save, or damaged."""
        folder = self._own_part_folder
        if folder is not None and f"rng/rank{self.rank}.pt" in data["files"]:  # saved together, by an earlier hpc
            return folder
        own = manifest.read(folder) if folder is not None else None
        if own is not None and own.get("format") == "part" and fileset.point(own) == fileset.point(data) \
                and f"rng/rank{self.rank}.pt" in (own.get("files") or {}):
            return folder  # the fast tier's folder of a rank not first on its node, checked as it was chosen
        if self.rank >= _saved_world(data, self.world):  # a rank new since the save: rank 0's note says so
            return None
        part = fileset.read_part(folder, self.rank) if folder is not None else None
        if part is None:
            why = "none was saved (save_state ran on the main process only)"
        elif fileset.point(part) != fileset.point(data):
            why = f"its part belongs to step {part.get('step')}, the checkpoint to step {data.get('step')}"
        else:
            why = manifest.verify(folder, part["files"])
            if why is None:
                return folder
        print(f"hpc: rank {self.rank} keeps its own random state and stream position: {why}", file=sys.stderr,
              flush=True)
        return None

    def load(self, folder: Path) -> dict:
        self.wait()
        states = self.states
        data = manifest.read(folder)
        shards = data.get("format") == manifest.SHARD and hasattr(self.format, "load_local")  # a fast-tier folder
        if data.get("format") != self.format.name and not shards:
            raise HpcError(f"{folder} holds a '{data.get('format')}' checkpoint; this job saves '{self.format.name}'",
                           fix="load it with the strategy that wrote it, or convert it with `hpc merge-weights`")
        saved_world = _saved_world(data, self.world)
        if saved_world != self.world and getattr(self.format, "fixed_world", None):
            raise HpcError(f"{folder} was saved at world size {saved_world} and this job runs at {self.world}: "
                           f"{self.format.fixed_world}", fix=f"resume it at world size {saved_world}, or take its "
                           "weights alone with `hpc merge-weights` and start a new run from them")
        if saved_world != self.world and self.rank == 0:
            print(f"hpc: {_random_streams_note(saved_world, self.world)}", file=sys.stderr, flush=True)
        # every file is read before any state changes: a refused one leaves the training state as it was
        mine = folder if not self.alone or self.rank == 0 else self._own_part(data)
        extras = self._read_extras(folder, mine)
        (self.format.load_local if shards else self.format.load)(folder, states.models, states.optimizers)
        for sched, state in zip(states.schedulers, extras["schedulers"]):
            sched.load_state_dict(state)
        if extras.get("scaler") is not None:
            self.precision.scaler.load_state_dict(extras["scaler"])
        for obj, state in zip(states.custom_objects, extras["custom"]):
            obj.load_state_dict(state)
        # loaders' epoch and position come with the meta (TrainingCheckpoints.restore); streams' state here
        for loader, reader in zip(states.loaders, extras.get("readers") or []):
            loader.restore_reader(reader)
        if extras.get("rng") is not None:  # a job resumed at another world size keeps its new ranks' fresh streams
            set_rng_state(extras["rng"])
        return data

    def _read_extras(self, folder: Path, mine: Path | None) -> dict:
        """The schedulers', scaler's, registered objects', stream readers' and RNG state, as tensors and plain
        data only (safe_load)."""
        states = self.states
        out: dict = {"schedulers": [safe_load.load(folder / f"scheduler_{i}.pt")
                                    for i in range(len(states.schedulers))],
                     "custom": [safe_load.load(folder / f"custom_{i}.pt", map_location=self.process.device)
                                for i in range(len(states.custom_objects))]}
        if self.precision.scaler is not None and (folder / "scaler.pt").exists():
            out["scaler"] = safe_load.load(folder / "scaler.pt")
        readers = mine / f"loaders/rank{self.rank}.pt" if mine is not None else None
        if readers is not None and readers.exists():
            out["readers"] = safe_load.load(readers)
        rng = mine / f"rng/rank{self.rank}.pt" if mine is not None else None
        if rng is not None and rng.exists():
            out["rng"] = safe_load.load(rng, allow=old_numpy_globals())  # earlier hpc saved numpy's ndarray
        return out


def _saved_world(data: dict, default: int) -> int:
    return int(data.get("world_size", default))


def _ranks(first: int, last: int) -> str:
    return f"rank {first}" if first == last else f"ranks {first}-{last}"


def _random_streams_note(saved: int, world: int) -> str:
    """The rule for random streams at another world size, said once: rank r < both sizes gets rank r's saved stream
    back; a rank new since the save keeps the one the script seeded; a saved rank this job lacks is not used."""
    shared = min(saved, world)
    said = ["rank 0 restores its random stream" if shared == 1 else f"{_ranks(0, shared - 1)} restore their random "
            "streams"]
    if world > saved:
        said.append(f"{_ranks(saved, world - 1)}, new since the save, keep the streams the script seeded")
    else:
        said.append(f"the saved streams of {_ranks(world, saved - 1)} are not used (no such rank now)")
    return f"the checkpoint was saved at world size {saved}, this job runs at {world}: {'; '.join(said)}"


def _beside(folder: Path, what: str) -> Path:
    return folder.with_name(f".{folder.name}.{what}")


def _swap_in(new: Path, folder: Path, at: tuple[int, int] | None = None) -> None:
    """The committed ``new`` takes ``folder``'s place; the old one is deleted only once it is out of the way.
    ``at``: a replicated save's point of training, whose other ranks wrote their parts into the old folder."""
    old = _beside(folder, "replaced")
    if old.exists():
        shutil.rmtree(old)
    folder.rename(old)
    try:
        new.rename(folder)
    except OSError:  # another rank writing its part recreated the folder between the two renames
        stray = _beside(folder, f"stray{os.getpid()}")
        folder.rename(stray)
        new.rename(folder)
        if at is not None:
            fileset.move_parts(stray, folder, at)
        shutil.rmtree(stray, ignore_errors=True)
    if at is not None:
        fileset.move_parts(old, folder, at)
    shutil.rmtree(old, ignore_errors=True)
