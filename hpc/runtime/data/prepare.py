"""prepare(dataloader): each rank iterates its share of what the loader would give one process.

The user's sampler, batch sampler, generator and collation are kept; hpc deals the loader's global batches to
the ranks (data_shards), so the ranks' batches read in rank order are one process's batches. Map-style
datasets are dealt by index before anything is loaded (data_plan, data_order); streams are read and dealt
(data_readers). A checkpoint records each loader's epoch and how much of its order was trained (data_position:
samples, not the rank's batch count, so a job resumed at another world size or batch size goes on at the same
sample); resuming mid-epoch computes where the epoch's order stands instead of replaying it, so it costs the same
at batch 10 or 10 million (only a sampler that can only be iterated, and a stream, are skipped by reading up to
there).

In a run with an optimizer, the batches that count as trained are those handed out up to its last step
(TrainingState.optimizer_stepped): a script that saves after fetching a batch and before training it (`if step %
N == 0: save_state()` at the top of its loop) has that batch trained after a resume, not lost; one that saves
inside an accumulation window has the window's batches trained again (their gradients are in no checkpoint).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from hpc.errors import HpcError
from hpc.runtime.configuration import DataLoaderConfiguration
from hpc.runtime.data.plan import MapPlan
from hpc.runtime.data.position import EpochPoint, Shape
from hpc.runtime.data.readers import MapReader, StreamReader
from hpc.runtime.data.sampler_shards import BatchSamplerShard
from hpc.runtime.data.shards import ShardLayout
from hpc.runtime.process.gradient_state import GradientState
from hpc.runtime.process.nest import send_to_device
from hpc.runtime.process.training_state import TrainingState


def _stateful_class(config: DataLoaderConfiguration):
    if not config.use_stateful_dataloader:
        return None
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        raise HpcError("use_stateful_dataloader needs torchdata's StatefulDataLoader, which is not installed",
                       fix="pip install torchdata (0.8 or newer), or drop use_stateful_dataloader") from None
    return StatefulDataLoader


def _check(loader: DataLoader, config: DataLoaderConfiguration, world: int, batch_size: int | None) -> None:
    if getattr(loader, "in_order", True) is False:
        raise HpcError("a DataLoader with in_order=False cannot be sharded: the ranks must agree on the order",
                       fix="drop in_order=False")
    if config.split_batches and batch_size is None:
        raise HpcError("split_batches needs the DataLoader's batch size, and this one has none",
                       fix="give the DataLoader batch_size=, or its batch sampler a batch_size attribute")
    if config.split_batches and batch_size % world:
        raise HpcError(f"split_batches: the batch size {batch_size} does not divide among {world} processes",
                       fix=f"use a multiple of {world}")


class PreparedDataLoader:
    """Iterates this rank's share on the process's device, and tells the training where it is.

    ``training`` (a TrainingState) is the run the loader feeds: told before the first batch (so a pending resume
    happens first) and on every batch (the hang watchdog's progress). ``gradient_state`` learns when the data
    ends. Both have inert defaults: accelerate.data_loader.prepare_data_loader needs no Accelerator."""

    def __init__(self, loader: DataLoader, *, world: int, rank: int, device: torch.device,
                 config: DataLoaderConfiguration | None = None, seed: int = 0, gradient_state=None,
                 training: TrainingState | None = None):
        config = config or DataLoaderConfiguration()
        self.dataset, self.config = loader.dataset, config
        self.device = torch.device(device) if device is not None else None  # None: batches stay where loaded
        self.base_dataloader = loader  # the user's loader: what hpc reads with is built from its settings
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self.training = training if training is not None else TrainingState()
        seed = config.data_seed if config.data_seed is not None else seed
        stream = isinstance(loader.dataset, IterableDataset)
        stateful = _stateful_class(config)
        # Accelerate's default: rank 0 reads a stream and sends each rank its batch
        dispatch = world > 1 and (config.dispatch_batches if config.dispatch_batches is not None else stream)
        self._plan = None
        if stream:
            batch_size, drop_last = loader.batch_size, loader.drop_last
        else:
            self._plan = plan = MapPlan(loader, seed, config.use_seedable_sampler)
            batch_size, drop_last = plan.batch_size, plan.drop_last
        _check(loader, config, world, batch_size)
        self.layout = ShardLayout(world, rank, config.split_batches, config.even_batches, drop_last, batch_size)
        if stream:
            self._reader = StreamReader(loader, self.layout, seed, dispatch, stateful)
        else:
            self._reader = MapReader(loader, plan, self.layout, seed, dispatch, stateful)
        self.batch_size = batch_size // world if config.split_batches else batch_size
        self.total_batch_size = batch_size if config.split_batches or batch_size is None else batch_size * world
        self._epoch = 0
        self._start = 0  # where the next (or current) pass enters its epoch, in the order's unit
        self._handed = 0  # batches of the current pass handed out
        self._handed_at_step = 0  # batches of the current pass handed out when the optimizer last stepped
        self._checkpoint_point: EpochPoint | None = None  # set by an explicit load_state until the next pass
        self._derived_skip: int | None = None  # the skip a script computes from the checkpoint's step count
        self._ended_epoch: int | None = None  # the epoch an explicit load_state's checkpoint had finished
        self._non_blocking = config.non_blocking or getattr(self.device, "type", None) == "cuda"
        self.end_of_dataloader, self.remainder = False, -1  # Accelerate's DataLoaderStateMixin, per loader

    @property
    def batch_sampler(self):
        """Accelerate's BatchSamplerShard, as far as scripts look into it: the batch sampler whose batches are
        dealt (the user's own is kept), and the dealing's settings. None for a stream."""
        return None if self._plan is None else ShardView(self)

    @contextlib.contextmanager
    def even_batches_as(self, even: bool):
        """join_uneven_inputs(even_batches=...): the passes inside the block deal with this setting."""
        before = self.layout
        self._use_layout(dataclasses.replace(before, even=bool(even)))
        try:
            yield
        finally:
            self._use_layout(before)

    def _use_layout(self, layout: ShardLayout) -> None:
        self.layout = self._reader.layout = layout

    def __len__(self) -> int:
        """The epoch's length in batches, at every point of it (a resumed epoch too), as Accelerate's: scripts
        compute `starting_epoch = resume_step // len(train_dataloader)` from it after load_state."""
        return len(self._reader)

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:  # a resumed point belongs to its own epoch only
            self._start, self._checkpoint_point = 0, None
            self._new_pass()
        self._epoch = epoch
        # told now as well as before the pass (as Accelerate's set_epoch does): scripts read it back
        aware = self._plan._epochs_aware if self._plan is not None else [self.dataset]
        for part in aware:
            if callable(getattr(part, "set_epoch", None)):
                part.set_epoch(epoch)

    @property
    def iteration(self) -> int:
        """Accelerate's name for the epoch the next pass runs."""
        return self._epoch

    @iteration.setter
    def iteration(self, epoch: int) -> None:
        self.set_epoch(epoch)

    # --- where the epoch stands ---------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        return Shape(self.layout.world, self.batch_size, self.layout.split)

    @property
    def unit(self) -> str:
        return self._reader.unit

    @property
    def _round(self) -> int:
        return self.shape.round_units(self.unit)

    @property
    def position(self) -> int:
        """This rank's batches of the current epoch, in this job's shape (a resumed start between two of its
        batches counts the one it is in)."""
        return self._start // self._round + self._handed

    def _new_pass(self) -> None:
        """Nothing of the next pass handed out or trained yet: a save between passes (an epoch's end) records the
        next epoch's start, never the last pass's counts."""
        self._handed = self._handed_at_step = 0

    def stepped(self) -> None:
        """The optimizer stepped: what this pass handed out so far is trained."""
        self._handed_at_step = self._handed

    def _trained(self) -> int:
        """This pass's batches that a checkpoint counts: up to the last optimizer step in a run that has one."""
        return self._handed_at_step if self.training.optimizers else self._handed

    def point(self) -> EpochPoint:
        """Where the epoch stands for a checkpoint: its order consumed up to the last batch the script trained."""
        consumed = self._start + self._trained() * self._round
        try:
            consumed = min(consumed, self._reader.units())
        except TypeError:  # a stream of unknown length
            pass
        return EpochPoint(self._epoch, consumed, self.unit, self.shape)

    def resume_at(self, epoch: int, position: int) -> None:
        """The next pass continues epoch `epoch` after its first `position` batches of this job's shape."""
        self.continue_from(EpochPoint(epoch, position * self._round, self.unit, self.shape))

    def continue_from(self, point: EpochPoint) -> None:
        """The next pass continues the point's epoch right after what it consumed."""
        if point.unit == "item" and point.shape.item_size() != self.shape.item_size() and None not in (
                point.shape.item_size(), self.shape.item_size()):
            raise HpcError(f"the checkpoint stopped after {point.consumed} batches of this loader's batch sampler, "
                           f"whose batches held {point.shape.item_size()} samples; they hold "
                           f"{self.shape.item_size()} now, and a batch sampler's batches cannot be counted in samples",
                           fix=f"resume with the batch sampler's batch size at {point.shape.item_size()}, or use a "
                               "sampler with DataLoader(batch_size=...)")
        if point.shape != self.shape and getattr(self._reader, "restore", None) is not None:
            # a StatefulDataLoader's state counts the batches of the shape it was saved in: read up to the point
            self._reader.restore = None
        self._reader.check_start(point.consumed)
        self._epoch, self._start = point.epoch, point.consumed
        self._new_pass()

    def restart_epoch(self, point: EpochPoint, derived_skip: int | None = None) -> None:
        """An explicit load_state: the next pass runs the point's epoch from its start (Accelerate's), and the first
        skip_first_batches of it goes to the point (skip_start). ``derived_skip``: what a script computes from the
        checkpoint's step count with gradient accumulation (`step * accumulation - epoch * len(loader)`)."""
        self._ended_epoch = None
        if self._reader.count_from(point.consumed) == 0:  # saved at the epoch's last batch: the next epoch is next
            self._ended_epoch = point.epoch
            point = dataclasses.replace(point, epoch=point.epoch + 1, consumed=0)
        self.resume_at(point.epoch, 0)
        self._checkpoint_point, self._derived_skip = point, derived_skip

    def skip_start(self, asked: int) -> int:
        """Where skip_first_batches(asked) enters the epoch: after `asked` batches of this job's shape, as the script
        asks, except on the first pass after a load_state where hpc knows the script's count is off (_skip_to);
        then the pass goes on where the checkpoint stopped, and rank 0 says so in one line."""
        point = self._checkpoint_point
        start, why = self._skip_to(asked)
        self._checkpoint_point = self._ended_epoch = None
        if why and self.layout.rank == 0:
            unit = "samples" if point.unit == "sample" else "batches of its order"
            off = asked * self._round - point.consumed
            print(f"hpc: skip_first_batches({asked}): the checkpoint stopped after {point.consumed} {unit} of epoch "
                  f"{point.epoch}: going on from there ({why}; skipping {asked} would "
                  f"{'lose' if off > 0 else 'repeat'} {abs(off)} {unit})", file=sys.stderr, flush=True)
        return start

    def peek_start(self, asked: int) -> int:
        """What skip_start(asked) will give, without using the checkpoint's point up."""
        return self._skip_to(asked)[0]

    def _skip_to(self, asked: int) -> tuple[int, str | None]:
        """(where to enter the epoch, why not where the script asked). hpc knows better than the script only when
        - the job's shape changed since the save: a count of batches means other samples now;
        - with gradient accumulation, the count is the one computed from the step number (`derived_skip`), which is
          off by the windows an epoch's end closed early (Accelerate then skips a batch too many or too few)."""
        point, asked_units = self._checkpoint_point, asked * self._round
        if point is None or point.consumed == asked_units:
            return asked_units, None
        if self._ended_epoch is not None:  # a count of the epoch the checkpoint finished
            return 0, f"the checkpoint ended epoch {self._ended_epoch} with its last batch, so epoch {point.epoch} " \
                      "starts from its first"
        if point.shape != self.shape:
            return point.consumed, (f"it was saved at {point.shape.describe()}, and this job runs at "
                                    f"{self.shape.describe()}")
        if asked == self._derived_skip:
            return point.consumed, f"{asked} counts whole accumulation windows, and an epoch's end closed some early"
        return asked_units, None  # the script's own count

    def _note_restart(self, point: EpochPoint | None) -> None:
        """A pass after load_state that did not skip starts the epoch over, as Accelerate's does: what the
        checkpoint had trained of it trains again. Right for a script that means it; rank 0 says so in one line."""
        if point is None or not point.consumed or self.layout.rank != 0:
            return
        unit = "samples" if point.unit == "sample" else "batches of its order"
        batches, left = divmod(point.consumed, self._round)
        how = f"skip_first_batches(loader, {batches}) goes on from there" if not left else \
            "skip_first_batches goes on from there"
        print(f"hpc: note: load_state restored epoch {point.epoch} after {point.consumed} {unit}, and this pass "
              f"starts the epoch from its first batch, as Accelerate's does: those train again ({how}; "
              "auto_resume needs neither)", file=sys.stderr, flush=True)

    def remaining_from(self, start: int) -> int:
        return self._reader.count_from(start)

    @property
    def restores_position(self) -> bool:
        """Whether an explicit load_state puts this loader back mid-epoch, as Accelerate's load_state does only for
        a StatefulDataLoader; other loaders restart their epoch and the script skips (skip_first_batches)."""
        return bool(self.config.use_stateful_dataloader)

    def state_dict(self) -> dict:
        out = self.point().state(self.position)
        # where a StatefulDataLoader's stream stands, once every batch handed out is trained (one not yet would be
        # past the point: the resume then reads up to the point instead)
        if getattr(self._reader, "stateful", False) and self._reader.after is not None and \
                self._trained() == self._handed:
            out["reader"] = self._reader.after
        return out

    def load_state_dict(self, state: dict, saved_world: int | None = None) -> None:
        self.restore_reader(state.get("reader"))
        self.continue_from(EpochPoint.from_state(state, self.unit, self.shape, saved_world))

    def restore_reader(self, reader_state) -> None:
        """A StatefulDataLoader's saved stream state: the next pass reads on from it."""
        if reader_state is not None and getattr(self._reader, "stateful", False):
            self._reader.restore = reader_state

    def __iter__(self):
        self.training.before_work()
        self._note_restart(self._checkpoint_point)
        self._checkpoint_point = self._ended_epoch = None  # a pass without skip_first_batches: from the start
        gradient = self.gradient_state
        self._new_pass()
        # an epoch entered between two of this shape's rounds (a checkpoint of another shape) has another remainder
        # than a straight run's: its final round is dealt in short even batches (shards._balanced)
        between = self.unit == "sample" and self._start % self._round != 0
        self._use_layout(dataclasses.replace(self.layout, balance_last=between))
        gradient.enter_dataloader(self)
        self.end_of_dataloader, self.remainder = False, -1
        try:
            first = True
            for batch, last, remainder in self._reader.batches(self._epoch, self._start):
                self.training.before_batch(self, first)
                first = False
                self._handed += 1
                gradient.end_of_dataloader = self.end_of_dataloader = last
                gradient.remainder = self.remainder = remainder if last else -1
                self.training.on_progress("batch")
                yield batch if self.device is None else send_to_device(batch, self.device, self._non_blocking)
        finally:
            gradient.leave_dataloader(self)
        self._start = 0
        self._new_pass()
        self._epoch += 1  # the next pass reshuffles; seeded, so a restart repeats it


class ShardView(BatchSamplerShard):
    """What `prepared.batch_sampler` is: Accelerate's BatchSamplerShard over the batch sampler whose batches are
    dealt (the user's own is kept), its settings read live from the loader. Iterating it deals as Accelerate's
    does; the loader itself deals by position (shards), which is what resumes at another world size."""

    def __init__(self, prepared: PreparedDataLoader):  # not super().__init__: these are read live
        self._prepared = prepared
        plan = prepared._plan
        self.batch_sampler = plan.batch_sampler if plan.batch_sampler is not None else BatchSampler(
            plan.sampler, plan.batch_size, plan.drop_last)
        self.sampler = getattr(self.batch_sampler, "sampler", None)

    @property
    def num_processes(self) -> int:
        return self._prepared.layout.world

    @property
    def process_index(self) -> int:
        return self._prepared.layout.rank

    @property
    def split_batches(self) -> bool:
        return self._prepared.layout.split

    @property
    def even_batches(self) -> bool:
        return self._prepared.layout.even

    @even_batches.setter
    def even_batches(self, even: bool) -> None:
        """Accelerate's join_uneven_inputs sets it on each loader's batch sampler: the loader deals so from then."""
        self._prepared._use_layout(dataclasses.replace(self._prepared.layout, even=bool(even)))

    @property
    def batch_size(self):
        """The dealt batch sampler's batch size (the global one with split_batches), as Accelerate's."""
        return getattr(self.batch_sampler, "batch_size", None)

    @property
    def drop_last(self) -> bool:
        return self._prepared.layout.drop_last

    def __len__(self) -> int:
        return len(self._prepared._reader)


class SkipFirstBatches:
    """skip_first_batches(dl, n): the current epoch from its batch n on, without loading the skipped batches.
    n counts from the epoch's start, as in Accelerate, whatever position a resume left the loader at: a script
    that skips after load_state never skips twice.

    The object is of the loader's own class (a DataLoaderShard's skip is a DataLoaderShard, as Accelerate's
    skip_first_batches gives) and shares the loader's state: what it hands out moves the loader's position, so the
    checkpoint of the prepared loader sees it."""

    __slots__ = ("n", "prepared")

    def __new__(cls, prepared: PreparedDataLoader, n: int):
        view = object.__new__(_skipping_class(type(prepared)) if cls is SkipFirstBatches else cls)
        view.__dict__ = prepared.__dict__  # one state: the prepared loader's
        view.prepared, view.n = prepared, n
        return view

    def __init__(self, prepared: PreparedDataLoader, n: int):
        pass

    def __len__(self) -> int:
        return self.remaining_from(self.peek_start(self.n))

    def __iter__(self):
        self._start = self.skip_start(self.n)
        yield from super().__iter__()


_SKIPPING: dict[type, type] = {}


def _skipping_class(loader_class: type) -> type:
    if loader_class not in _SKIPPING:
        _SKIPPING[loader_class] = type(loader_class.__name__, (SkipFirstBatches, loader_class),
                                       {"__slots__": (), "__module__": loader_class.__module__,
                                        "__qualname__": loader_class.__qualname__})
    return _SKIPPING[loader_class]
