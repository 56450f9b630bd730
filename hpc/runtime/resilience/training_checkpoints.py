"""One run's checkpoints as save_state/load_state see them: the checkpointer (made on first use), the save and
load pre-hooks, the folder a script names, what a checkpoint records of the loop (counters, loader positions)
and putting it back. When to save and load (resume, preemption, pacing) is the run guard's."""

from __future__ import annotations

import atexit
import collections
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from torch.nn.parallel import DistributedDataParallel
from torch.utils.hooks import RemovableHandle

from hpc.runtime.checkpoint import manifest
from hpc.runtime.checkpoint.checkpointer import Checkpointer
from hpc.runtime.checkpoint.store import CheckpointStore
from hpc.runtime.data.position import EpochPoint
from hpc.runtime.precision import Precision
from hpc.runtime.process.gradient_state import GradientState
from hpc.runtime.process.process_state import ProcessState
from hpc.runtime.process.training_state import TrainingState
from hpc.runtime.resilience import preemption, progress_guard
from hpc.runtime.settings import Checkpointing


class StateHooks:
    """save_state/load_state pre-hooks, by registration order, each removable through its handle."""

    def __init__(self):
        self.save: collections.OrderedDict = collections.OrderedDict()  # weakly referenced by the handles
        self.load: collections.OrderedDict = collections.OrderedDict()

    def add(self, kind: str, hook):
        table = getattr(self, kind)
        handle = RemovableHandle(table)
        table[handle.id] = hook
        return handle


@dataclass(frozen=True)
class ResumeInfo:
    """Where a resumed run stands: optimizer steps done, the first dataloader's epoch and batch in it."""

    path: Path
    step: int
    epoch: int
    batch: int


class TrainingCheckpoints:
    def __init__(self, process: ProcessState, training: TrainingState, strategy, precision: Precision,
                 options: Checkpointing, on_resumed: Callable[[int], None]):
        self.process, self.training, self.strategy, self.precision = process, training, strategy, precision
        self.options, self.on_resumed = options, on_resumed
        self.hooks = StateHooks()
        self._checkpointer: Checkpointer | None = None

    # an Accelerator may be pickled: the copy starts its own writer when it first saves; hooks are this process's
    def __getstate__(self) -> dict:
        return {**self.__dict__, "_checkpointer": None, "hooks": StateHooks()}

    @property
    def directory(self) -> Path:
        return self.options.directory

    @property
    def checkpointer(self) -> Checkpointer:
        if self._checkpointer is None:
            store = CheckpointStore(self.directory, self.options.keep)
            self._checkpointer = Checkpointer(self.process, self.training, self.precision,
                                              self.strategy.checkpoint_format(), store, self.options.fsync,
                                              arrival_timeout_s=self.options.arrival_timeout_s)
        return self._checkpointer

    @property
    def started(self) -> bool:
        return self._checkpointer is not None

    def forget(self) -> None:
        """free_memory: the writer and what it knows of the store go (the next save makes a new one)."""
        self._checkpointer = None

    def wait(self) -> None:
        if self.started:
            try:
                self._checkpointer.wait()
            finally:
                _note_committed(ended=id(self))

    def folder_named(self, path: str | os.PathLike) -> Path:
        """The checkpoint folder a script names. Sharded state is one folder all ranks write, so every rank takes
        rank 0's path (scripts often name one per rank: tempfile.TemporaryDirectory() on each). Replicated state
        is saved and loaded by each rank alone, with no collective (save_state may run on the main process only):
        each rank's own folder, where rank 0's holds the shared state (checkpointer.choose)."""
        return Path(path if self.checkpointer.alone else self.process.broadcast_object(str(path)))

    def step_folder(self) -> Path:
        return self.checkpointer.store.step_dir(self.training.completed_steps)

    def save(self, folder: Path, async_save: bool, purge: bool) -> Path:
        """In a job, rank 0 notes the step as the job's progress once the save has committed (progress_guard); a
        background save's commit is seen at the next save, at wait() or as the process exits."""
        meta = self.meta()
        self.wait()  # a background save in flight commits (and is noted) first, as checkpointer.save would wait
        saved = self.checkpointer.save(folder, meta, async_save=async_save, purge=purge,
                                       before_write=self._run_save_hooks)
        if self.process.is_main_process and os.environ.get("HPC_JOB_DIR"):
            if async_save:  # committed in the background, unless the format could not: then noted right away
                _in_flight.append((id(self), Path(saved), meta["step"]))
                _note_committed()
            else:
                progress_guard.note(meta["step"])
        return saved

    def meta(self) -> dict:
        """What a checkpoint records of the loop (every tier's)."""
        return {"step": self.training.completed_steps, "micro_step": self.training.saved_micro_step,
                "strategy": self.strategy.name, "loaders": self.training.positions()}

    def models_for_hooks(self) -> list:
        """The models as Accelerate hands them to save/load hooks: under DDP the user's own module (diffusers'
        hooks call its save_pretrained), elsewhere the prepared one."""
        return [m.module if isinstance(m, DistributedDataParallel) else m for m in self.training.models]

    def _run_save_hooks(self, folder: Path) -> None:
        if self.hooks.save:
            models = self.models_for_hooks()
            weights = [self.strategy.unwrap(m).state_dict() for m in models]
            for hook in list(self.hooks.save.values()):
                hook(models, weights, str(folder))

    def run_load_hooks(self, folder: Path) -> None:
        for hook in list(self.hooks.load.values()):
            hook(self.models_for_hooks(), str(folder))

    def restore(self, meta: dict, folder: Path, mid_epoch: bool, tier: str | None = None) -> ResumeInfo:
        """The loop's counters and each loader's place, from a loaded checkpoint's ``meta``: ``mid_epoch``, right
        after the last batch the checkpoint trained; else at the top of its epoch, unless the loader restores its
        own position (a script that skips by itself then lands where the checkpoint stopped). A checkpoint saved in
        another shape (world size, batch size) goes on at the same sample (data/position.py)."""
        training = self.training
        training.completed_steps, training.micro_step = int(meta.get("step", 0)), int(meta.get("micro_step", 0))
        training.micro_step_at_step = training.micro_step
        saved_world = meta.get("world_size")
        accumulation = GradientState().num_steps or 1
        moved = []
        for index, (loader, where) in enumerate(zip(training.loaders, meta.get("loaders", []))):
            point = EpochPoint.from_state(where, loader.unit, loader.shape, saved_world)
            if point.shape != loader.shape:
                moved.append((index, loader, point))
            if mid_epoch or loader.restores_position:
                loader.continue_from(point)
            else:
                derived = training.completed_steps * accumulation - point.epoch * len(loader)
                loader.restart_epoch(point, derived_skip=derived if accumulation > 1 else None)
        first = (meta.get("loaders") or [{"epoch": 0, "position": 0}])[0]
        self.on_resumed(training.completed_steps)
        if self.process.is_main_process:
            read = f", the {tier} tier" if tier else ""  # which tier of checkpoints: node, peer or shared
            preemption.log(f"resumed from {folder} (step {training.completed_steps}{read})")
            for index, loader, point in moved:
                unit = "samples" if point.unit == "sample" else "batches of its order"
                which = f"loader {index}: " if len(training.loaders) > 1 else ""
                preemption.log(f"{which}resumed epoch {point.epoch} after {point.consumed} {unit}: saved at "
                               f"{point.shape.describe()}, now {loader.shape.describe()}")
                if not mid_epoch and not loader.restores_position:
                    # a self-resuming script's arithmetic counts steps in batches of the shape it saved in
                    preemption.log(f"{which}len(loader) is {len(loader)} batches in this shape: a script's own "
                                   "arithmetic (starting_epoch = step // len(loader)) no longer lands on the "
                                   f"checkpoint's epoch {point.epoch}; hpc's auto_resume needs none")
        return ResumeInfo(folder, training.completed_steps, int(first["epoch"]), int(first["position"]))


# rank 0's background saves, noted as progress once committed: (whose, folder, step); no model is kept alive by it
_in_flight: list[tuple[int, Path, int]] = []


def _note_committed(ended: int | None = None, everything: bool = False) -> None:
    """Note each background save that has committed (its manifest holds its step). The saves of TrainingCheckpoints
    ``ended`` (its id), or with ``everything`` all of them, are over: those that did not commit are forgotten."""
    for entry in list(_in_flight):
        whose, folder, step = entry
        data = manifest.read(folder)
        if data is not None and data.get("step") == step:
            progress_guard.note(step)
            _in_flight.remove(entry)
        elif everything or whose == ended:
            _in_flight.remove(entry)


# Python joins the background save threads (not daemons) before it runs this: a save that committed as the process
# ended (a crash after it, an exit with no wait) still counts
atexit.register(_note_committed, everything=True)
