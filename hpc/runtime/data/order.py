"""An epoch's sample order and its global batches, addressable by position where that can be had cheaply.

A resumed job must reach batch 1,000,000 of an epoch without producing the 999,999 before it (Accelerate's
issue 2606: skipping by iterating took hours). So wherever the order is known in closed form (a range, a
seeded shuffle, a list, a sampler with `__getitem__`), batch k is computed directly; only a sampler that
can only be iterated is skipped by consuming its indices (no sample is loaded either way).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Callable, Iterator

import torch

# Up to this many samples a seeded shuffle is torch.randperm (exactly uniform, a fraction of a second);
# beyond it a keyed permutation whose k-th element costs O(1), so resuming late in a huge epoch is instant
# (randperm of 2e8 takes ~25 s on two cores, before a single batch).
RANDPERM_MAX = 1 << 22
_BLOCK = 4096  # positions a keyed shuffle computes at once: per-call tensor overhead dwarfs per-element cost
_M32 = 0xFFFFFFFF


class RangeOrder:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def slice(self, a: int, b: int) -> list:
        return list(range(a, min(b, self.n)))


class TensorOrder:
    def __init__(self, order: torch.Tensor):
        self.order = order

    def __len__(self) -> int:
        return len(self.order)

    def slice(self, a: int, b: int) -> list:
        return self.order[a:b].tolist()


class SequenceOrder:
    """A sampler that can be indexed: `sampler[i]` is taken to be the i-th index its iteration gives."""

    def __init__(self, seq):
        self.seq = seq

    def __len__(self) -> int:
        return len(self.seq)

    def slice(self, a: int, b: int) -> list:
        b = min(b, len(self.seq))
        if isinstance(self.seq, torch.Tensor):
            return self.seq[a:b].tolist()
        if isinstance(self.seq, (list, tuple, range)):
            return list(self.seq[a:b])
        return [self.seq[i] for i in range(a, b)]


class KeyedShuffle:
    """A pseudo-random permutation of range(n) with O(1) access: a 4-round Feistel network over the smallest
    even number of bits that holds n, walking the cycle until the value falls inside range(n)."""

    ROUNDS = 4

    def __init__(self, n: int, seed: int):
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self.half, self.mask = bits // 2, (1 << (bits // 2)) - 1
        g = torch.Generator().manual_seed(seed)
        self.keys = torch.randint(0, 2**31, (self.ROUNDS,), generator=g).tolist()
        self._block: tuple[int, list] = (-1, [])

    def __len__(self) -> int:
        return self.n

    def _once(self, x: torch.Tensor) -> torch.Tensor:
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            f = right + key  # a 32-bit integer hash of (right, key); halves stay below 2**31, so no overflow
            f.mul_(0x45D9F3B).bitwise_and_(_M32).bitwise_xor_(f >> 16)
            f.mul_(0x45D9F3B).bitwise_and_(_M32).bitwise_xor_(f >> 16)
            left, right = right, f.bitwise_and_(self.mask).bitwise_xor_(left)
        return left.bitwise_left_shift_(self.half).bitwise_or_(right)

    def permute(self, positions: torch.Tensor) -> torch.Tensor:
        y = self._once(positions.clone())
        outside = y >= self.n
        while outside.any():  # at most 3 of 4 values fall outside; each walk ends (a permutation's cycle)
            where = outside.nonzero().squeeze(1)
            y[where] = self._once(y[where])
            outside = y >= self.n
        return y

    def slice(self, a: int, b: int) -> list:
        b = min(b, self.n)
        out: list = []
        while a < b:
            block = a // _BLOCK
            if self._block[0] != block:
                start = block * _BLOCK
                self._block = (block, self.permute(torch.arange(start, min(start + _BLOCK, self.n))).tolist())
            offset = a - block * _BLOCK
            take = min(b - a, _BLOCK - offset)
            out += self._block[1][offset:offset + take]
            a += take
        return out


def seeded_shuffle(n: int, seed: int):
    if n <= RANDPERM_MAX:
        return TensorOrder(torch.randperm(n, generator=torch.Generator().manual_seed(seed)))
    return KeyedShuffle(n, seed)


def random_sampler_order(sampler: torch.utils.data.RandomSampler, generator: torch.Generator) -> torch.Tensor:
    """What torch's RandomSampler yields for one pass, as a tensor, drawing from `generator` exactly as its
    __iter__ does (so the generator ends where one process's would)."""
    n, m = len(sampler.data_source), sampler.num_samples
    if sampler.replacement:
        parts = [torch.randint(high=n, size=(32,), dtype=torch.int64, generator=generator) for _ in range(m // 32)]
        parts.append(torch.randint(high=n, size=(m % 32,), dtype=torch.int64, generator=generator))
    else:
        parts = [torch.randperm(n, generator=generator) for _ in range(m // n)]
        parts.append(torch.randperm(n, generator=generator)[: m % n])
    return torch.cat(parts)


def indexable(obj) -> bool:
    """Whether a sampler (or batch sampler) can be read by position: lists, ranges, tensors, and objects that
    define `__getitem__` beside `__len__` (their promise: `obj[i]` is the i-th thing iterating them gives)."""
    if isinstance(obj, (str, bytes, Mapping)):
        return False
    return isinstance(obj, (Sequence, torch.Tensor)) or (
        hasattr(type(obj), "__getitem__") and hasattr(type(obj), "__len__"))


# --- global batches ----------------------------------------------------------------------------------
# A source opens one epoch at `start` and returns (batches from there, the epoch's first `keep` batches): those
# fill up the last round. `start` counts the source's unit (data_position): samples of the order for a sampler
# with a batch size, whole batches for a batch sampler. From a sample that is not on a batch boundary (a job
# resumed with another batch size), the batches are cut from there on: every sample once, none twice.

def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    return samples // batch_size if drop_last else math.ceil(samples / batch_size)


class OrderBatches:
    """Batches of `batch_size` consecutive positions of an addressable order."""

    unit = "sample"

    def __init__(self, order, batch_size: int, drop_last: bool):
        self.order, self.batch_size, self.drop_last = order, batch_size, drop_last

    def __len__(self) -> int:
        return batch_count(len(self.order), self.batch_size, self.drop_last)

    def batch(self, k: int) -> list:
        return self.order.slice(k * self.batch_size, (k + 1) * self.batch_size)

    def open(self, start: int, keep: int) -> tuple[Iterator, Callable[[], list]]:
        n, bs = len(self.order), self.batch_size
        count = batch_count(n - start, bs, self.drop_last) if start < n else 0
        return ((self.order.slice(start + k * bs, start + (k + 1) * bs) for k in range(count)),
                lambda: [self.batch(k) for k in range(min(keep, len(self)))])


class IndexedUnits:
    """A batch sampler (or a sampler of whole batches) with `__getitem__`: batch k is `obj[k]`."""

    unit = "item"

    def __init__(self, obj):
        self.obj = obj

    def __len__(self) -> int:
        return len(self.obj)

    def open(self, start: int, keep: int):
        count = len(self)
        return (self.obj[k] for k in range(start, count)), lambda: [self.obj[k] for k in range(min(keep, count))]


class StreamedSamples:
    """A sampler that can only be iterated: skipped by consuming its indices (at C speed, nothing loaded)."""

    unit = "sample"

    def __init__(self, sampler, batch_size: int, drop_last: bool):
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def open(self, start: int, keep: int, on_end: Callable[[], None] = lambda: None):
        samples = iter(self.sampler)
        head = list(itertools.islice(samples, keep * self.batch_size))
        stream = _skip(head, samples, start)

        def batches():
            while batch := list(itertools.islice(stream, self.batch_size)):
                if len(batch) < self.batch_size and self.drop_last:
                    break
                yield batch
            on_end()

        first = [head[i:i + self.batch_size] for i in range(0, len(head), self.batch_size)]
        return batches(), lambda: [b for b in first if len(b) == self.batch_size or not self.drop_last]


class StreamedUnits:
    """A batch sampler that can only be iterated: skipped by consuming its batches of indices."""

    unit = "item"

    def __init__(self, obj):
        self.obj = obj

    def __len__(self) -> int:
        return len(self.obj)

    def open(self, start: int, keep: int, on_end: Callable[[], None] = lambda: None):
        units = iter(self.obj)
        head = list(itertools.islice(units, keep))
        stream = _skip(head, units, start)

        def batches():
            yield from stream
            on_end()

        return batches(), lambda: list(head)


def _skip(head: list, rest: Iterator, count: int) -> Iterator:
    """What follows the first `count` of head + rest; the skipped part of `rest` consumed at C speed."""
    if count < len(head):
        return itertools.chain(head[count:], rest)
    next(itertools.islice(rest, count - len(head), count - len(head)), None)
    return rest
