"""prepare(dataloader): each rank iterates its share of what the loader would give one process.

The user's sampler, batch sampler, generator and collation are kept; hpc deals the loader's global batches to
the ranks (data_shards), so the ranks' batches read in rank order are one process's batches. Map-style
datasets are dealt by index before anything is loaded (data_plan, data_order); streams are read and dealt
(data_readers). A checkpoint records each loader's epoch and position; resuming mid-epoch computes where the
epoch's order stands instead of replaying it, so it costs the same at batch 10 or 10 million (only a sampler
that can only be iterated, and a stream, are skipped by reading up to there).
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
from hpc.runtime.data.readers import MapReader, StreamReader
from hpc.runtime.data.shards import ShardLayout
from hpc.runtime.gradient_state import GradientState
from hpc.runtime.nest import send_to_device
from hpc.runtime.training_state import TrainingState


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
        self.dataset, self.config, self.device = loader.dataset, config, torch.device(device)
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
        self._epoch, self._skip = 0, 0
        self.position = 0  # batches of the current epoch handed out (what a checkpoint records)
        self._checkpoint_position: int | None = None  # set by an explicit load_state until the next pass
        self._non_blocking = config.non_blocking or self.device.type == "cuda"

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
        if epoch != self._epoch:  # a resumed position belongs to its own epoch only
            self._skip = 0
        self._epoch = epoch

    def resume_at(self, epoch: int, position: int) -> None:
        """The next pass continues epoch `epoch` after its first `position` batches."""
        self._epoch, self._skip, self.position = epoch, position, position

    def restart_epoch(self, epoch: int, checkpoint_position: int) -> None:
        """An explicit load_state: the next pass runs epoch `epoch` from its start (Accelerate's), and the first
        skip_first_batches of it skips to `checkpoint_position`, where the checkpoint stopped."""
        if checkpoint_position >= len(self):  # saved at the epoch's last batch: the next epoch is next
            epoch, checkpoint_position = epoch + 1, 0
        self.resume_at(epoch, 0)
        self._checkpoint_position = checkpoint_position

    def skip_target(self, asked: int) -> int:
        """How many batches skip_first_batches(asked) skips: what was asked, except on the first pass after a
        load_state, where it is the checkpoint's position. Scripts compute the skip from the step number
        (`resume_step = step * accumulation - epoch * len(loader)`), which is off by the windows that an
        epoch's end closed early when the accumulation does not divide the epoch: Accelerate then skips a
        batch too many or too few; hpc loses and repeats none."""
        position, self._checkpoint_position = self.peek_skip(asked), None
        if position == asked:
            return asked
        if self.layout.rank == 0:
            print(f"hpc: skip_first_batches({asked}): the checkpoint stopped after batch {position} of this epoch; "
              f"going on from there (skipping {asked} would {'lose' if asked > position else 'repeat'} "
                  f"{abs(asked - position)})", file=sys.stderr, flush=True)
        return position

    def peek_skip(self, asked: int) -> int:
        """What skip_target(asked) will give, without using the checkpoint's position up."""
        return asked if self._checkpoint_position is None else self._checkpoint_position

    @property
    def restores_position(self) -> bool:
        """Whether an explicit load_state puts this loader back mid-epoch, as Accelerate's load_state does only for
        a StatefulDataLoader; other loaders restart their epoch and the script skips (skip_first_batches)."""
        return bool(self.config.use_stateful_dataloader)

    def state_dict(self) -> dict:
        out = {"epoch": self._epoch, "position": self.position}
        if getattr(self._reader, "stateful", False) and self._reader.after is not None:
            out["reader"] = self._reader.after  # where a StatefulDataLoader's stream stands
        return out

    def load_state_dict(self, state: dict) -> None:
        self.resume_at(int(state["epoch"]), int(state["position"]))
        if state.get("reader") is not None and getattr(self._reader, "stateful", False):
            self._reader.restore = state["reader"]

    def __iter__(self):
        self.training.before_work()
        self._checkpoint_position = None  # a pass without skip_first_batches first: the epoch from its start
        gradient = self.gradient_state
        self.position = self._skip
        gradient.enter_dataloader(self)
        try:
            first = True
            for batch, last, remainder in self._reader.batches(self._epoch, self._skip):
                self.training.before_batch(self, first)
                first = False
                self.position += 1
                gradient.end_of_dataloader = last
                gradient.remainder = remainder if last else -1
                self.training.on_progress("batch")
                yield send_to_device(batch, self.device, self._non_blocking)
        finally:
            gradient.leave_dataloader(self)
        self._skip, self.position = 0, 0
        self._epoch += 1  # the next pass reshuffles; seeded, so a restart repeats it


class ShardView:
    """What `prepared.batch_sampler` shows (Accelerate's BatchSamplerShard's attributes), read live."""

    def __init__(self, prepared: PreparedDataLoader):
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

    @property
    def batch_size(self):
        return self._prepared.batch_size

    @property
    def drop_last(self) -> bool:
        return self._prepared.layout.drop_last

    def __len__(self) -> int:
        return len(self._prepared._reader)


class SkipFirstBatches:
    """skip_first_batches(dl, n): the current epoch from its batch n on, without loading the skipped batches.
    n counts from the epoch's start, as in Accelerate, whatever position a resume left the loader at: a script
    that skips after load_state never skips twice."""

    def __init__(self, prepared: PreparedDataLoader, n: int):
        self.prepared, self.n = prepared, n

    def __len__(self) -> int:
        return max(0, len(self.prepared._reader) - self.prepared.peek_skip(self.n))

    def __iter__(self):
        self.prepared._skip = self.prepared.skip_target(self.n)
        yield from self.prepared

