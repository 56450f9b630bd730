"""Accelerate's standalone sharding pieces: BatchSamplerShard, IterableDatasetShard, SkipBatchSampler, get_sampler.

A prepared loader does not iterate these: hpc deals the global batches by position (shards, readers), which is what
lets it resume at another world size. They exist for scripts and libraries that build them directly, with
Accelerate's exact dealing (its tests/test_data_loader.py is the reference: the last round is completed with the
epoch's first indices, or dropped, or left short, as there), and a prepared loader's `.batch_sampler` is a
BatchSamplerShard that reads its settings from the loader.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import BatchSampler, IterableDataset


class BatchSamplerShard(BatchSampler):
    """One process's batches of ``batch_sampler``: whole batches dealt in turn (or, with ``split_batches``, a slice
    of each). With ``even_batches`` every process gets as many full batches as the others, the last round completed
    from the epoch's first indices; without, the last round is left short. A batch sampler with ``drop_last`` drops
    the last incomplete round."""

    def __init__(self, batch_sampler, num_processes: int = 1, process_index: int = 0, split_batches: bool = False,
                 even_batches: bool = True):
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        if split_batches and (self.batch_size is None or self.batch_size % num_processes != 0):
            # ValueError, as Accelerate's: callers catch that type
            raise ValueError(f"To use `BatchSamplerShard` in `split_batches` mode, the batch size ({self.batch_size}) "
                             f"needs to be a round multiple of the number of processes ({num_processes}).")

    @property
    def total_length(self) -> int:
        return len(self.batch_sampler)

    def __len__(self) -> int:
        total, world = len(self.batch_sampler), self.num_processes
        if self.split_batches:
            return total
        rounds, left = divmod(total, world)
        if not left or self.drop_last:
            return rounds
        if self.even_batches:
            return rounds + 1
        return rounds + (1 if self.process_index < left else 0)

    def __iter__(self):
        return self._split() if self.split_batches else self._dealt()

    def _split(self):
        part = self.batch_size // self.num_processes
        mine = slice(part * self.process_index, part * (self.process_index + 1))
        first = last = None
        for batch in self.batch_sampler:
            if first is None:
                first = list(batch)
            last = batch
            if len(batch) == self.batch_size:
                yield batch[mine]
        if self.drop_last or not first or len(last) == self.batch_size:
            return
        if not self.even_batches:
            if len(last) > mine.start:
                yield last[mine]
            return
        filler = list(first)
        while len(filler) < self.batch_size:  # a dataset smaller than one batch: its indices repeat
            filler += filler
        yield (list(last) + filler)[mine]

    def _dealt(self):
        world, rank, size = self.num_processes, self.process_index, self.batch_size
        first: list = []  # the first round's indices (or batches, when their size varies): they complete the last
        mine = None  # this process's batch of the round being read, yielded once the round is known to be full
        index, batch = -1, []
        for index, batch in enumerate(self.batch_sampler):
            if not self.drop_last and index < world:
                if size is None:
                    first.append(batch)
                else:
                    first += batch
            if index % world == rank:
                mine = batch
            if index % world == world - 1 and (size is None or len(batch) == size):
                yield mine
                mine = None
        if self.drop_last or not first:
            return
        if not self.even_batches:
            if mine:
                yield mine
            return
        if mine and (size is None or len(mine) == size):
            yield mine
        needed = world * size if size is not None else world
        while len(first) < needed:
            first += first
        if size is None or len(batch) == size:  # the last batch read was full: it was dealt already
            batch, index = [], index + 1
        taken = 0
        while index % world != 0 or batch:
            if size is None:
                batch = first[taken]
                taken += 1
            else:
                end = taken + size - len(batch)
                batch = list(batch) + first[taken:end]
                taken = end
            if index % world == rank:
                yield batch
            batch, index = [], index + 1


class IterableDatasetShard(IterableDataset):
    """One process's samples of an iterable dataset: every process reads the whole stream and keeps its slice of
    each round of ``batch_size x num_processes`` samples (of each ``batch_size`` with ``split_batches``). Without
    ``drop_last`` the last round is completed from the stream's first round."""

    def __init__(self, dataset: IterableDataset, batch_size: int = 1, drop_last: bool = False,
                 num_processes: int = 1, process_index: int = 0, split_batches: bool = False):
        if split_batches and batch_size > 1 and batch_size % num_processes != 0:
            raise ValueError(f"To use `IterableDatasetShard` in `split_batches` mode, the batch size ({batch_size}) "
                             f"needs to be a round multiple of the number of processes ({num_processes}).")
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        rounds = len(self.dataset) / (self.batch_size * self.num_processes)
        return (int(rounds) if self.drop_last else math.ceil(rounds)) * self.batch_size

    def __iter__(self):
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)  # every process draws the same stream
        round_size = self.batch_size if self.split_batches else self.batch_size * self.num_processes
        part = self.batch_size // self.num_processes if self.split_batches else self.batch_size
        mine = slice(self.process_index * part, (self.process_index + 1) * part)
        first, current = None, []
        for element in self.dataset:
            current.append(element)
            if len(current) == round_size:
                yield from current[mine]
                if first is None:
                    first = list(current)
                current = []
        if self.drop_last or not current:
            return
        filler = first if first is not None else list(current)
        while len(current) < round_size:
            current += filler
        yield from current[mine]


class SkipBatchSampler(BatchSampler):
    """``batch_sampler``'s batches after its first ``skip_batches`` (the skipped ones are never loaded)."""

    def __init__(self, batch_sampler, skip_batches: int = 0):
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches

    def __iter__(self):
        for index, samples in enumerate(self.batch_sampler):
            if index >= self.skip_batches:
                yield samples

    @property
    def total_length(self) -> int:
        return len(self.batch_sampler)

    def __len__(self) -> int:
        return len(self.batch_sampler) - self.skip_batches


def get_sampler(dataloader):
    """The sampler under a loader's batching (the one a batch sampler given as `sampler=` holds)."""
    if isinstance(dataloader.sampler, BatchSampler):
        return getattr(dataloader.sampler, "sampler", None)
    return getattr(dataloader.batch_sampler, "sampler", None)
