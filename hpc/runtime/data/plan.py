"""Which global batches a map-style DataLoader gives in each epoch: the ones one process would see, in its order.

The user's sampler and batch sampler are kept. What hpc changes is where randomness comes from, because every
rank must draw the same order and a restarted job must draw it again:

- a RandomSampler without a generator of its own shuffles by hpc's seed for the epoch, (data_seed or the
  Accelerator's seed, epoch);
- any other sampler with a `generator` attribute left None gets a generator seeded the same way each epoch;
- with use_seedable_sampler, a RandomSampler becomes a SeedableRandomSampler (its order a function of (seed,
  epoch)), and other samplers' generators are seeded as above whatever generator the user gave;
- otherwise a generator the user gave is kept: each rank starts from rank 0's state, and it advances from epoch to
  epoch as in one process (the DataLoader's own generator included: it gives one number per pass). An epoch
  reached without passing through the ones before it (a resumed job) is reached by replaying their draws.

Samplers, batch samplers and datasets with `set_epoch` are told the epoch before each pass.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from hpc.runtime.data import order
from hpc.runtime.data.samplers import SeedableRandomSampler


def epoch_seed(seed: int, epoch: int) -> int:
    return seed * 1_000_003 + epoch


class MapPlan:
    def __init__(self, loader: DataLoader, seed: int, seedable: bool):
        self.seed, self.seedable, self.dataset = seed, seedable, loader.dataset
        self.unbatched = loader.batch_size is None and loader.batch_sampler is None
        self.sampler = self.batch_sampler = None
        # a loader that does not batch may have a batch sampler as its sampler: the dataset takes whole lists
        given = loader.sampler if self.unbatched else loader.batch_sampler
        if loader.batch_size is not None:
            self.sampler, self.batch_size, self.drop_last = loader.sampler, loader.batch_size, loader.drop_last
        elif type(given) is BatchSampler:  # torch's own: its sampler and size say it all
            self.sampler, self.batch_size, self.drop_last = given.sampler, given.batch_size, given.drop_last
        else:  # a batch sampler of the user's (or single indices): its items are dealt whole
            self.batch_sampler = given
            self.batch_size = getattr(given, "batch_size", None)
            self.drop_last = bool(getattr(given, "drop_last", False))
        if seedable and type(self.sampler) is RandomSampler:  # Accelerate's use_seedable_sampler swaps it too
            s = self.sampler
            self.sampler = SeedableRandomSampler(s.data_source, replacement=s.replacement, num_samples=s._num_samples,
                                                 data_seed=seed)
        self._shuffles = type(self.sampler) is RandomSampler and self.sampler.generator is None
        parts = _unique([self.sampler, self.batch_sampler, getattr(self.batch_sampler, "sampler", None)])
        computed = self._shuffles or isinstance(self.sampler, SeedableRandomSampler)  # never iterated
        holders = [o for o in parts if isinstance(getattr(o, "generator", False), (torch.Generator, type(None)))
                   and not (o is self.sampler and computed)]
        self._seeded = [o for o in holders if seedable or o.generator is None]
        self._base_draw = loader.generator if loader.generator is not None and not seedable else None
        user = [self._base_draw] + [o.generator for o in holders if o not in self._seeded]
        self._user = _GeneratorEpochs(_unique(user))
        self._started = False
        self._persistent = loader.persistent_workers and loader.num_workers > 0
        self._epochs_aware = [o for o in _unique(parts + [self.dataset]) if callable(getattr(o, "set_epoch", None))]

    # --- size ---------------------------------------------------------------------------------------
    @property
    def unit(self) -> str:
        """What the epoch's order counts (data_position): samples, or the whole batches of a batch sampler."""
        return "item" if self.sampler is None else "sample"

    def units(self) -> int:
        """The epoch's length in its unit."""
        return len(self.batch_sampler) if self.sampler is None else len(self.sampler)

    def items(self, start: int = 0) -> tuple[int, int | None]:
        """Global batches of the epoch from `start` (in its unit) on, and the size of the last one (None if
        unknown)."""
        if self.sampler is None:
            return max(0, len(self.batch_sampler) - start), None
        n = max(0, len(self.sampler) - start)
        if self.drop_last:
            return n // self.batch_size, self.batch_size
        count = math.ceil(n / self.batch_size)
        return count, n - (count - 1) * self.batch_size if count else None

    # --- one epoch ----------------------------------------------------------------------------------
    def source(self, epoch: int):
        """The epoch's global batches, with every generator where this epoch needs it."""
        self._user.go_to(epoch, self._replay)
        self._enter(epoch)
        source = self._source(epoch)
        if self._user.generators and isinstance(source, (order.StreamedSamples, order.StreamedUnits)):
            return _Recording(source, lambda: self._user.reached(epoch + 1))
        self._user.reached(epoch + 1)  # an order computed up front has drawn all it will draw
        return source

    def _enter(self, epoch: int) -> None:
        for obj in self._epochs_aware:
            obj.set_epoch(epoch)
        for obj in self._seeded:
            obj.generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        if self._base_draw is not None and (epoch == 0 or not self._persistent):
            # one process's DataLoader draws its workers' base seed from its generator at each pass
            torch.empty((), dtype=torch.int64).random_(generator=self._base_draw)

    def _source(self, epoch: int):
        if self.sampler is None:
            return order.IndexedUnits(self.batch_sampler) if order.indexable(self.batch_sampler) \
                else order.StreamedUnits(self.batch_sampler)
        s = self.sampler
        if isinstance(s, SeedableRandomSampler):
            ordering = s.order(epoch)
        elif type(s) is SequentialSampler:
            ordering = order.RangeOrder(len(s))
        elif self._shuffles:
            seed = epoch_seed(self.seed, epoch)
            if not s.replacement and s.num_samples == len(s.data_source):
                ordering = order.seeded_shuffle(len(s), seed)
            else:
                ordering = order.TensorOrder(order.random_sampler_order(s, torch.Generator().manual_seed(seed)))
        elif type(s) is RandomSampler:
            ordering = order.TensorOrder(order.random_sampler_order(s, s.generator))
        elif order.indexable(s):
            ordering = order.SequenceOrder(s)
        else:
            return order.StreamedSamples(s, self.batch_size, self.drop_last)
        return order.OrderBatches(ordering, self.batch_size, self.drop_last)

    def _replay(self, epoch: int) -> None:
        """One pass's draws from the user's generators, nothing else: to reach a later epoch's state."""
        self._enter(epoch)
        source = self._source(epoch)
        if not isinstance(source, order.OrderBatches):
            for _ in source.open(0, 0)[0]:
                pass

    def start(self, world: int, collective: bool) -> None:
        """At the first pass: the user's generators as they stand now are epoch 0's (a script may seed them after
        prepare()); with ``collective``, every rank takes rank 0's (as Accelerate synchronises them)."""
        if self._started:
            return
        self._started = True
        self._user = _GeneratorEpochs(self._user.generators)
        if collective:
            self.sync_generators(world)

    def sync_generators(self, world: int) -> None:
        if world > 1 and dist.is_available() and dist.is_initialized() and self._user.generators:
            states = [self._user.states[0]]
            dist.broadcast_object_list(states, src=0)
            self._user.states = {0: states[0]}
            self._user.restore(0)


class _GeneratorEpochs:
    """The user's generators as they stand at the start of each epoch (as far as known)."""

    def __init__(self, generators: list[torch.Generator]):
        self.generators = generators
        self.states: dict[int, list] = {0: [g.get_state() for g in generators]} if generators else {}

    def restore(self, epoch: int) -> None:
        for g, s in zip(self.generators, self.states[epoch]):
            g.set_state(s)

    def go_to(self, epoch: int, replay) -> None:
        if not self.generators:
            return
        known = max(e for e in self.states if e <= epoch)
        self.restore(known)
        for e in range(known, epoch):
            replay(e)
            self.reached(e + 1)

    def reached(self, epoch: int) -> None:
        if self.generators:
            self.states[epoch] = [g.get_state() for g in self.generators]


class _Recording:
    """A streamed source that notes the generators' state once its pass has drawn everything."""

    def __init__(self, source, done):
        self.source, self.done = source, done

    def __len__(self) -> int:
        return len(self.source)

    def open(self, start: int, keep: int):
        return self.source.open(start, keep, on_end=self.done)


def _unique(objs: list) -> list:
    return list({id(o): o for o in objs if o is not None}.values())

