"""Dealing an epoch's global batches to the ranks so that, read in rank order, they give back the global order.

Without split_batches, global batch i goes whole to rank i % world (a round is `world` consecutive batches);
with it, each global batch is cut into `world` equal slices, one per rank. The final round is what needs
care: with even_batches it is filled up with samples from the start of the epoch, so every rank runs as
many batches of the same size (none waits in a collective for one that has run out) and `remainder` says
how many samples of that round are real (gather_for_metrics drops the rest); without, ranks may get one
batch fewer and the last batch may be short. A drop_last loader drops an incomplete final round.

The items dealt are either lists of sample indices (map-style datasets: nothing is loaded yet) or collated
batches (streams); `ops` says how to measure, cut and join them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from hpc.errors import HpcError

_END = object()


@dataclass(frozen=True)
class ShardLayout:
    world: int
    rank: int
    split: bool = False
    even: bool = True
    drop_last: bool = False
    batch_size: int | None = None  # a full global item's size; None: items may differ in size
    # an epoch resumed from a checkpoint of another shape: its final round is cut short and even (_balanced)
    balance_last: bool = False

    @property
    def head_items(self) -> int:
        """How many of the epoch's first items the padding of the final round can draw on."""
        if self.drop_last or not self.even:
            return 0
        return 1 if self.split else self.world

    def count(self, items: int, last_size: int | None = None) -> int:
        """This rank's batches in an epoch of `items` global items (the last one `last_size` long)."""
        if self.split:
            short = last_size is not None and self.batch_size is not None and last_size < self.batch_size
            if short and not self.even and last_size <= self.rank * (self.batch_size // self.world):
                return items - 1
            return items
        full, extra = divmod(items, self.world)
        if extra == 0 or self.drop_last:
            return full
        return full + 1 if self.even or self.rank < extra else full


@dataclass
class Round:
    parts: list  # one per rank; None where a rank gets nothing this round
    last: bool
    remainder: int = -1  # real samples in the final round when it was filled up (or complete), else -1
    before: object = None  # where the reader stood before this round's first item (a stateful loader's state)


class ListOps:
    """Items that are lists of sample indices (or single indices, for a loader that does not batch)."""

    @staticmethod
    def size(item) -> int:
        return len(item) if isinstance(item, (list, tuple, range, torch.Tensor)) else 1

    @staticmethod
    def take(item, a: int, b: int):
        return list(item[a:b])

    @staticmethod
    def join(items: list):
        return [i for item in items for i in item]


class _Padding:
    """The epoch's first samples, cycled: what fills up the final round."""

    def __init__(self, head: list, ops):
        self.head, self.ops = [h for h in head if ops.size(h)], ops
        self._pool, self._at, self._item = None, 0, 0

    def samples(self, count: int):
        if self._pool is None:
            self._pool = self.ops.join(self.head) if len(self.head) > 1 else self.head[0]
        total, pieces = self.ops.size(self._pool), []
        while count:  # a tiny dataset may need its start several times over
            start = self._at % total
            take = min(count, total - start)
            pieces.append(self.ops.take(self._pool, start, start + take))
            self._at, count = self._at + take, count - take
        return pieces[0] if len(pieces) == 1 else self.ops.join(pieces)

    def item(self):
        item = self.head[self._item % len(self.head)]
        self._item += 1
        return item


def rounds(items: Iterator, head: Callable[[], list], layout: ShardLayout, ops,
           where: Callable[[], object] = lambda: None) -> Iterator[Round]:
    """The rounds of one epoch from `items` (the epoch's global items from some position on); `head()` gives
    the epoch's first `layout.head_items` items, asked for only if the final round needs filling up."""
    it = iter(items)
    mark = where()
    pending = next(it, _END)
    deal = _split if layout.split else _whole
    while pending is not _END:
        group, before = [], mark
        while len(group) < (1 if layout.split else layout.world) and pending is not _END:
            group.append(pending)
            mark = where()
            pending = next(it, _END)
        out = deal(group, pending is _END, head, layout, ops)
        if out is None:
            return
        out.before = before
        yield out


def _whole(group: list, last: bool, head, layout: ShardLayout, ops) -> Round | None:
    world, bs = layout.world, layout.batch_size
    if not last:
        return Round(group, False)
    sizes = [ops.size(x) for x in group]
    if len(group) == world and (bs is None or sizes[-1] >= bs):
        return Round(group, True, sum(sizes) if layout.even else -1)
    if layout.drop_last:
        return None
    if not layout.even:
        return Round(group + [None] * (world - len(group)), True)
    if layout.balance_last and bs is not None:
        return _balanced(group, head, layout, ops)
    pad = _Padding(head(), ops)
    if bs is not None and sizes[-1] < bs:
        group[-1] = ops.join([group[-1], pad.samples(bs - sizes[-1])])
    while len(group) < world:
        group.append(pad.samples(bs) if bs is not None else pad.item())
    return Round(group, True, sum(sizes))


def _split(group: list, last: bool, head, layout: ShardLayout, ops) -> Round | None:
    item, world, bs = group[0], layout.world, layout.batch_size
    size, piece = ops.size(item), bs // world
    if size > bs:
        raise HpcError(f"split_batches: a batch of {size} samples is larger than the loader's batch_size ({bs})",
                       fix="give the batch sampler a batch_size that its batches keep to")
    if size < bs:  # only the epoch's last batch is short
        if layout.drop_last:
            return None
        if not layout.even:
            return Round([ops.take(item, r * piece, min(size, (r + 1) * piece)) if size > r * piece else None
                          for r in range(world)], last)
        if layout.balance_last:
            return _balanced([item], head, layout, ops)
        item = ops.join([item, _Padding(head(), ops).samples(bs - size)])
    return Round([ops.take(item, r * piece, (r + 1) * piece) for r in range(world)], last,
                 size if last and layout.even else -1)


def _balanced(items: list, head, layout: ShardLayout, ops) -> Round:
    """The final round of an epoch resumed in another shape, whose remaining samples that shape need not divide
    (the shape it started in did, or left another remainder): they are cut into equal shorter batches, each rank
    ceil(r / world) samples, and only the fewer than `world` still missing are filled from the epoch's start.
    Full batches would repeat up to a whole round of samples that the run had never trained twice."""
    real = ops.join(items) if len(items) > 1 else items[0]
    size, world = ops.size(real), layout.world
    per = -(-size // world)
    pool = ops.join([real, _Padding(head(), ops).samples(per * world - size)]) if per * world > size else real
    return Round([ops.take(pool, r * per, (r + 1) * per) for r in range(world)], True, size)


@dataclass
class Part:
    item: object
    last: bool  # this rank's last batch of the epoch
    remainder: int
    after: object = None  # where the reader stands once this rank has had this part (a stateful loader's state)


def deal(all_rounds: Iterator[Round], world: int, end: Callable[[], object] = lambda: None) -> Iterator[list]:
    """Per round, every rank's Part (None where it gets nothing). A rank's last part is known one round
    ahead: without even_batches the final round may have nothing for it."""
    held = None
    for r in all_rounds:
        if held is not None:
            yield _parts(held, r, world)
        held = r
    if held is not None:
        yield _parts(held, None, world, end())


def _parts(r: Round, following: Round | None, world: int, end_state=None) -> list:
    out = []
    for rank in range(world):
        if r.parts[rank] is None:
            out.append(None)
            continue
        last = following is None or (following.last and following.parts[rank] is None)
        after = following.before if following is not None else end_state
        out.append(Part(r.parts[rank], last, r.remainder if r.last else -1, after))
    return out


def mine(dealt: Iterator[list], rank: int) -> Iterator[Part]:
    for parts in dealt:
        if parts[rank] is not None:
            yield parts[rank]
