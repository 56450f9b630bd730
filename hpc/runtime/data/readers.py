"""Reading one epoch of a rank's batches: map-style datasets by index, streams by reading them, either on
every rank or (dispatch_batches) on rank 0 only, which sends each rank its batch.

Each reader yields (batch, last, remainder) from a given point of an epoch on: `start` counts the epoch's order in
the reader's `unit` (data_position), so a job resumed in another shape lands on the same sample.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from hpc.errors import HpcError
from hpc.runtime.data import shards
from hpc.runtime.data.batches import BatchOps
from hpc.runtime.data.plan import MapPlan, epoch_seed

_END = "end"  # what rank 0 sends every rank once the epoch is over


def loader_settings(loader: DataLoader) -> dict:
    """How the user's loader loads (workers, collation, pinning), for the loaders hpc builds in its place."""
    out = {"num_workers": loader.num_workers, "collate_fn": loader.collate_fn, "pin_memory": loader.pin_memory,
           "timeout": loader.timeout, "worker_init_fn": loader.worker_init_fn,
           "multiprocessing_context": loader.multiprocessing_context,
           "persistent_workers": loader.persistent_workers and loader.num_workers > 0}
    if loader.num_workers:
        out["prefetch_factor"] = loader.prefetch_factor
    return out


class _Feed:
    """The batch sampler of the loader hpc reads with: whatever the current pass deals, noted in order so
    each loaded batch can be matched with what is known about it (in_order loading keeps them aligned)."""

    def __init__(self):
        self.parts: Iterator = iter(())
        self.notes: deque = deque()

    def __iter__(self):
        for note, item in self.parts:
            self.notes.append(note)
            yield item


class MapReader:
    def __init__(self, loader: DataLoader, plan: MapPlan, layout: shards.ShardLayout, seed: int, dispatch: bool,
                 stateful_class=None):
        self.plan, self.layout, self.seed, self.dispatch = plan, layout, seed, dispatch
        self._generator = torch.Generator()  # starting an iterator draws from it: never from the global RNG
        self._feed = _Feed()
        cls = stateful_class or DataLoader
        feed = {"sampler": self._feed, "batch_size": None} if plan.unbatched else {"batch_sampler": self._feed}
        self.loader = cls(loader.dataset, generator=self._generator, **feed, **loader_settings(loader))

    @property
    def unit(self) -> str:
        return self.plan.unit

    def units(self) -> int:
        return self.plan.units()

    def __len__(self) -> int:
        return self.layout.count(*self.plan.items())

    def count_from(self, start: int) -> int:
        """This rank's batches of an epoch entered at `start`."""
        return self.layout.count(*self.plan.items(start))

    def check_start(self, start: int) -> None:
        """Every point of a map-style epoch can be started from."""

    def batches(self, epoch: int, start: int) -> Iterator[tuple]:
        self.plan.start(self.layout.world, collective=not self.dispatch)  # dispatched: rank 0's alone count
        dealt = self._dealt(epoch, start) if self.layout.rank == 0 or not self.dispatch else None
        if not self.dispatch:
            self._feed.parts = ((p, p.item) for p in shards.mine(dealt, self.layout.rank))
            for batch in self.loader:
                part = self._feed.notes.popleft()
                yield batch, part.last, part.remainder
            return
        if self.layout.rank != 0:
            yield from receive()
            return
        self._feed.parts = ((note, p.item) for i, parts in enumerate(dealt)
                            for note, p in _noted(i, parts))
        yield from send(self._rounds_loaded(), self.layout.world)

    def _dealt(self, epoch: int, start: int):
        source = self.plan.source(epoch)
        items, head = source.open(start, self.layout.head_items)
        self._generator.manual_seed(epoch_seed(self.seed, epoch))
        return shards.deal(shards.rounds(items, head, self.layout, shards.ListOps), self.layout.world)

    def _rounds_loaded(self) -> Iterator[list]:
        """Rank 0's loaded batches, regrouped into rounds of Parts."""
        out, got = [None] * self.layout.world, 0
        for batch in self.loader:
            (index, rank, count), part = self._feed.notes.popleft()
            out[rank] = shards.Part(batch, part.last, part.remainder)
            got += 1
            if got == count:
                yield out
                out, got = [None] * self.layout.world, 0


def _noted(index: int, parts: list):
    count = sum(p is not None for p in parts)
    return [(((index, rank, count), p), p) for rank, p in enumerate(parts) if p is not None]


class StreamReader:
    """An IterableDataset, read through a loader built like the user's, one global batch after another;
    a rank keeps every world-th (or its slice of each). Skipping into an epoch means reading up to there,
    unless a StatefulDataLoader's saved state puts the stream back where it was."""

    def __init__(self, loader: DataLoader, layout: shards.ShardLayout, seed: int, dispatch: bool, stateful_class=None):
        self.layout, self.seed, self.dispatch, self.dataset = layout, seed, dispatch, loader.dataset
        self._generator = torch.Generator()
        self._settings = {"batch_size": loader.batch_size, "drop_last": loader.drop_last, **loader_settings(loader)}
        self.loader = (stateful_class or DataLoader)(loader.dataset, generator=self._generator, **self._settings)
        self.stateful = stateful_class is not None
        self.restore = None  # a saved reader state the next pass starts from
        self.after = None  # the reader's state once the last batch handed out has been had

    @property
    def unit(self) -> str:
        """A stream of collated batches of a known size is counted in samples; one of no fixed size in batches."""
        return "item" if self._settings["batch_size"] is None else "sample"

    def units(self) -> int:
        return len(self.dataset)  # TypeError for a stream of unknown length, as len(DataLoader) gives

    def __len__(self) -> int:
        return self.count_from(0)

    def count_from(self, start: int) -> int:
        n = max(0, len(self.dataset) - start)
        bs = self._settings["batch_size"]
        if bs is None:
            return self.layout.count(n, None)
        items = n // bs if self._settings["drop_last"] else -(-n // bs)
        return self.layout.count(items, n - (items - 1) * bs if not self._settings["drop_last"] else bs)

    def check_start(self, start: int) -> None:
        """A stream is entered by reading whole batches of its loader: a sample that is not on a batch boundary
        (a job resumed with another batch size) cannot be reached exactly."""
        bs = self._settings["batch_size"]
        if self.restore is None and bs is not None and start % bs:
            raise HpcError(f"the checkpoint stopped this stream after {start} samples of its epoch, which its batches "
                           f"of {bs} cannot reach exactly (a stream is skipped by reading whole batches)",
                           fix=f"resume with a batch size that divides {start}, e.g. the one it was saved with")

    def batches(self, epoch: int, start: int) -> Iterator[tuple]:
        if self.dispatch and self.layout.rank != 0:
            yield from receive()
            return
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)
        self._generator.manual_seed(epoch_seed(self.seed, epoch))
        bs = self._settings["batch_size"]
        items, head = self._open(start if bs is None else start // bs)
        where = self.loader.state_dict if self.stateful else (lambda: None)
        dealt = shards.deal(shards.rounds(items, head, self.layout, BatchOps, where), self.layout.world, where)
        if self.dispatch:
            yield from send(dealt, self.layout.world, self._note)
            return
        for part in shards.mine(dealt, self.layout.rank):
            self.after = part.after
            yield part.item, part.last, part.remainder

    def _note(self, parts: list) -> None:
        self.after = parts[0].after if parts[0] is not None else self.after

    def _open(self, start: int) -> tuple[Iterator, Callable[[], list]]:
        keep = self.layout.head_items
        if self.restore is not None:  # the stream goes on where the saved state left it: nothing to read
            self.loader.load_state_dict(self.restore)
            self.restore = None
            fresh = DataLoader(self.dataset, generator=torch.Generator().manual_seed(self._generator.initial_seed()),
                               **self._settings)
            return iter(self.loader), lambda: list(itertools.islice(iter(fresh), keep))
        it = iter(self.loader)
        head = list(itertools.islice(it, keep))
        stream = itertools.chain(head, it)
        next(itertools.islice(stream, start, start), None)  # the cost of a stream: reading up to `start`
        return stream, lambda: head


# --- dispatch: rank 0 reads, every rank gets its part --------------------------------------------------
def _scatter(messages: list | None):
    out = [None]
    dist.scatter_object_list(out, messages, src=0)
    return out[0]


def send(dealt: Iterator[list], world: int, note: Callable[[list], None] = lambda parts: None) -> Iterator[tuple]:
    """Rank 0: each round, every rank's batch (or None) goes to it; rank 0 keeps its own. All ranks take
    part in every round, then in a last message that ends the epoch."""
    for parts in dealt:
        note(parts)
        mine = _scatter([None if p is None else (p.item, p.last, p.remainder) for p in parts])
        if mine is not None:
            yield mine
    _scatter([_END] * world)


def receive() -> Iterator[tuple]:
    while (message := _scatter(None)) != _END:
        if message is not None:
            yield message
