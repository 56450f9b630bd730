"""save_state / load_state: the whole training state, committed atomically, optionally in the background.

Every rank writes its own files and publishes their checksums; rank 0 merges them into the manifest and
renames it into place last. Nothing reads a folder without a manifest, and nothing loads a file whose
size or checksum differs from it: the newest good checkpoint is used, with a one-line note for each one
skipped.
"""

from __future__ import annotations

import random
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

from hpc.errors import HpcError
from hpc.runtime import ops
from hpc.runtime.checkpoint import fileset, manifest
from hpc.runtime.checkpoint.fileset import FileSet
from hpc.runtime.checkpoint.formats import StagingBuffers
from hpc.runtime.checkpoint.store import CheckpointStore

COMMIT_TIMEOUT_S = 1800.0  # how long rank 0 waits for the other ranks' files before giving the save up


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    def __init__(self, accelerator, fmt, store: CheckpointStore, fsync: bool = False):
        self.acc, self.format, self.store, self.fsync = accelerator, fmt, store, fsync
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._staging = StagingBuffers()  # reused by every background save (one is in flight at a time)

    @property
    def rank(self) -> int:
        return self.acc.process_index

    @property
    def world(self) -> int:
        return self.acc.num_processes

    def _barrier(self) -> None:
        self.acc.wait_for_everyone()

    def _all_gather(self, obj) -> list:
        return ops.gather_object(obj, self.world)

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
        committed holds this very state (the same step, saved again after a resume) and is kept. Any other
        committed folder (a script's save_state("latest"), called again) is replaced whole: the new state is
        written beside it and swapped in once committed, so a crash mid-save leaves the old one loadable.
        ``before_write(work_folder)`` runs on every rank once the folder exists (save_state's pre-hooks)."""
        self.wait()  # one save in flight: the next waits for the previous to commit
        folder = Path(folder)
        committed = manifest.read(folder) is not None
        if committed and folder.parent == self.store.root:
            self._barrier()
            return folder
        work = _beside(folder, "saving") if committed else folder
        if self.rank == 0:
            if work.exists():  # left by a save that was cut short
                shutil.rmtree(work)
            work.mkdir(parents=True)
        self._barrier()
        if before_write is not None:
            before_write(work)

        # GPU state goes through pinned host buffers even for a synchronous save: faster than the pageable
        # copies torch.save makes of each tensor
        buffers = self._staging if async_save or self.acc.device.type == "cuda" else None
        staged = self.format.stage(self.acc.training.models, self.acc.training.optimizers, copy=buffers,
                                   background=async_save)
        extras = self._extras(buffers)
        staged.start(work)
        if buffers is not None:
            buffers.synchronize()
        background = async_save and staged.background_ok

        def job() -> None:
            files = FileSet(work, self.rank, fsync=self.fsync)
            for name, obj in extras.items():
                files.save(name, obj)
            staged.write(work, files)
            files.finish()
            if self.rank == 0:
                self._commit(work, meta, purge)
                if work != folder:
                    _swap_in(work, folder)

        if background:
            def run() -> None:
                try:
                    job()
                except BaseException as e:  # noqa: BLE001 - handed to the training thread at wait()
                    self._error = e

            self._thread = threading.Thread(target=run, name="hpc-checkpoint")  # not daemon: exit waits for it
            self._thread.start()
        else:
            job()
            self._barrier()  # every rank returns once the checkpoint is committed
        return folder

    def _extras(self, buffers: StagingBuffers | None) -> dict:
        acc = self.acc
        out = {f"rng/rank{self.rank}.pt": rng_state()}
        readers = [dl.state_dict().get("reader") for dl in acc.training.loaders]
        if any(r is not None for r in readers):  # a StatefulDataLoader's stream: where each rank's reader stands
            out[f"loaders/rank{self.rank}.pt"] = readers
        if self.rank == 0:
            for i, sched in enumerate(acc.training.schedulers):
                out[f"scheduler_{i}.pt"] = sched.state_dict()
            if acc.precision.scaler is not None:
                out["scaler.pt"] = acc.precision.scaler.state_dict()
            for i, obj in enumerate(acc.training.custom_objects):
                out[f"custom_{i}.pt"] = obj.state_dict()
        return buffers.copy(out, "extras") if buffers is not None else out

    def _commit(self, folder: Path, meta: dict, purge: bool) -> None:
        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        while (files := fileset.collect(folder, self.world)) is None:
            if time.monotonic() > deadline:
                raise HpcError(f"{folder}: not every rank finished its part of the checkpoint within "
                               f"{COMMIT_TIMEOUT_S:.0f} s; it stays uncommitted", fix="see the other ranks' logs")
            time.sleep(0.02)
        manifest.commit(folder, files, {"world_size": self.world, "format": self.format.name, **meta},
                        fsync=self.fsync)
        fileset.clear_sums(folder, self.world)
        if purge and folder.parent == self.store.root:
            self.store.purge(background=True)

    # --- loading ------------------------------------------------------------------------------------
    def _settle(self, folder: Path) -> None:
        """A replacement cut short between its two renames: finish it (or roll it back) before reading."""
        if self.rank == 0 and not folder.exists():
            saving, replaced = _beside(folder, "saving"), _beside(folder, "replaced")
            if manifest.read(saving) is not None:
                saving.rename(folder)
            elif replaced.exists():
                replaced.rename(folder)
        self._barrier()

    def _damage(self, folder: Path) -> str | None:
        """Checked by all ranks together, each a share of the files; the same answer on every rank."""
        data = manifest.read(folder)
        if data is None:
            mine = f"{folder}: no {manifest.NAME} (the save never finished)"
        else:
            names = sorted(data["files"])[self.rank::self.world]
            mine = manifest.verify(folder, data["files"], names)
        problems = [p for p in self._all_gather(mine) if p]
        return problems[0] if problems else None

    def choose(self, folder: Path | None) -> Path | None:
        """The explicit folder (damage is an error), or the newest good one in the store (None if none)."""
        if folder is not None:
            self._settle(Path(folder))
            problem = self._damage(Path(folder))
            if problem:
                raise HpcError(f"cannot load checkpoint: {problem}", fix="pick another step folder")
            return Path(folder)
        candidates = self._all_gather([e.path for e in self.store.committed()] if self.rank == 0 else None)[0]
        for path in candidates:
            problem = self._damage(path)
            if not problem:
                return path
            if self.rank == 0:
                print(f"hpc: skipping damaged checkpoint {path.name}: {problem}", file=sys.stderr, flush=True)
        return None

    def load(self, folder: Path) -> dict:
        self.wait()
        acc = self.acc
        data = manifest.read(folder)
        if data.get("format") != self.format.name:
            raise HpcError(f"{folder} holds a '{data.get('format')}' checkpoint; this job saves '{self.format.name}'",
                           fix="load it with the strategy that wrote it, or convert it with `hpc merge-weights`")
        self.format.load(folder, acc.training.models, acc.training.optimizers)
        device = acc.device
        for i, sched in enumerate(acc.training.schedulers):
            sched.load_state_dict(torch.load(folder / f"scheduler_{i}.pt", weights_only=False))
        if acc.precision.scaler is not None and (folder / "scaler.pt").exists():
            acc.precision.scaler.load_state_dict(torch.load(folder / "scaler.pt", weights_only=False))
        for i, obj in enumerate(acc.training.custom_objects):
            obj.load_state_dict(torch.load(folder / f"custom_{i}.pt", map_location=device, weights_only=False))
        readers = folder / f"loaders/rank{self.rank}.pt"
        if readers.exists():  # loaders' epoch and position come with the meta (_restore); streams' state here
            for loader, reader in zip(acc.training.loaders, torch.load(readers, weights_only=False)):
                if reader is not None:
                    loader.load_state_dict({**loader.state_dict(), "reader": reader})
        rng = folder / f"rng/rank{self.rank}.pt"
        if rng.exists():  # a job resumed at another world size keeps the fresh streams of its new ranks
            set_rng_state(torch.load(rng, weights_only=False))
        return data


def _beside(folder: Path, what: str) -> Path:
    return folder.with_name(f".{folder.name}.{what}")


def _swap_in(new: Path, folder: Path) -> None:
    """The committed ``new`` takes ``folder``'s place; the old one is deleted only once it is out of the way."""
    old = _beside(folder, "replaced")
    if old.exists():
        shutil.rmtree(old)
    folder.rename(old)
    new.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
