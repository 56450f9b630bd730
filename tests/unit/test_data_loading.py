"""prepare(dataloader): the ranks' batches, read in rank order, are one process's batches, for every kind of
loader Accelerate shards; resuming mid-epoch gives exactly the rest and costs the same late in a huge epoch.

Every case here builds PreparedDataLoader in this process for each rank of a pretend world (no process group is
needed to deal indices); what needs real ranks (rank 0 reading and sending, generators synchronised) is
tests/test_data_loading.py, one 2-rank launch.
"""

import itertools
import sys
import time
import types

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler, SubsetRandomSampler

from hpc.errors import HpcError
from hpc.runtime.configuration import DataLoaderConfiguration
from hpc.runtime.data.order import KeyedShuffle
from hpc.runtime.data.prepare import PreparedDataLoader, SkipFirstBatches


# --- loaders of every kind ----------------------------------------------------------------------------
class Reversed(Sampler):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))


class UnevenBatches:
    """A batch sampler of the user's: batches of different sizes, no batch_size attribute."""

    def __len__(self):
        return 6

    def __iter__(self):
        yield from ([0, 1], [2, 3, 4], [5], [6, 7], [8, 9, 10], [11])


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class SizedStream(Stream):
    def __len__(self):
        return self.n


class Counting(torch.utils.data.Dataset):
    """Each sample is its index; counts how many were loaded."""

    def __init__(self, n):
        self.n, self.loaded = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.loaded += 1
        return i


MAKERS = {
    "default": lambda: DataLoader(torch.arange(23), batch_size=4),
    "reversed sampler": lambda: DataLoader(torch.arange(23), batch_size=4, sampler=Reversed(23)),
    "list sampler": lambda: DataLoader(torch.arange(23), batch_size=4, sampler=[5, 3, 1, 22, 0, 7, 8, 2, 4]),
    "batch sampler": lambda: DataLoader(torch.arange(12), batch_sampler=UnevenBatches()),
    "torch batch sampler": lambda: DataLoader(torch.arange(23), batch_sampler=BatchSampler(Reversed(23), 4, False)),
    "loader generator": lambda: DataLoader(torch.arange(23), batch_size=4, shuffle=True,
                                           generator=torch.Generator().manual_seed(5)),
    "sampler generator": lambda: DataLoader(torch.arange(23), batch_size=4, sampler=SubsetRandomSampler(
        range(23), generator=torch.Generator().manual_seed(5))),
}


class _Gradient:
    """One simulated rank's gradient state (the real one is shared by the whole process)."""
    end_of_dataloader, remainder = False, -1

    def enter_dataloader(self, loader):
        self.end_of_dataloader, self.remainder = False, -1

    leave_dataloader = enter_dataloader


def simulated_rank(make, rank, world, seed=0, **config):
    """rank's loader of a job of world, built in this one process (no process group: nothing is dispatched)."""
    gradient = _Gradient()
    loader = PreparedDataLoader(make(), world=world, rank=rank, device="cpu", config=DataLoaderConfiguration(**config),
                                seed=seed, gradient_state=gradient)
    return loader, types.SimpleNamespace(gradient_state=gradient)


def prepared(make, rank, world, **config):
    return simulated_rank(make, rank, world, **config)


def epoch(dl, acc):
    """One pass: each batch as a list, with what the accelerator was told at it."""
    return [(b.tolist(), acc.gradient_state.end_of_dataloader, acc.gradient_state.remainder) for b in dl]


def per_rank(make, world, epochs=1, **config):
    out = []
    for rank in range(world):
        dl, acc = prepared(make, rank, world, **config)
        out.append([[b for b, _, _ in epoch(dl, acc)] for _ in range(epochs)])
    return out


def interleave(ranks, e=0):
    """The ranks' batches of epoch e in rank-interleaved order (round by round)."""
    return [b for batches in itertools.zip_longest(*(r[e] for r in ranks)) for b in batches if b is not None]


def one_process(make, epochs=1):
    dl = make()
    return [[b.tolist() for b in dl] for _ in range(epochs)]


# --- the ranks together are one process ---------------------------------------------------------------
@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("world", [2, 3])
def test_the_ranks_batches_in_rank_order_are_one_process_batches(kind, world):
    ranks = per_rank(MAKERS[kind], world, epochs=3, even_batches=False)
    alone = one_process(MAKERS[kind], epochs=3)
    assert [interleave(ranks, e) for e in range(3)] == alone


def test_a_reversing_sampler_comes_back_reversed():
    ranks = per_rank(MAKERS["reversed sampler"], 2, even_batches=False)
    assert [i for b in interleave(ranks) for i in b] == list(range(22, -1, -1))
    assert ranks[0][0][0] == [22, 21, 20, 19] and ranks[1][0][0] == [18, 17, 16, 15]


def test_the_default_shuffle_is_seeded_by_epoch_and_the_same_on_every_rank():
    make = lambda: DataLoader(torch.arange(40), batch_size=4, shuffle=True)  # noqa: E731
    alone = per_rank(make, 1, epochs=2)[0]
    ranks = per_rank(make, 2, epochs=2)
    assert [interleave(ranks, e) for e in range(2)] == alone
    assert sorted(i for b in alone[0] for i in b) == list(range(40)) and alone[0] != alone[1]
    assert per_rank(make, 2, epochs=2) == ranks  # a restarted job sees the same order


# --- even_batches, split_batches -----------------------------------------------------------------------
def test_even_batches_fill_the_last_round_from_the_start_and_say_how_much_is_real():
    make = lambda: DataLoader(torch.arange(10), batch_size=2)  # noqa: E731
    even = [epoch(*prepared(make, r, 2)) for r in range(2)]
    assert even[0] == [([0, 1], False, -1), ([4, 5], False, -1), ([8, 9], True, 4 + 2 - 4)]
    assert even[1] == [([2, 3], False, -1), ([6, 7], False, -1), ([0, 1], True, 2)]
    uneven = [epoch(*prepared(make, r, 2, even_batches=False)) for r in range(2)]
    assert [len(b) for b in uneven] == [3, 2] and uneven[1][-1] == ([6, 7], True, -1)
    assert [len(prepared(make, r, 2, even_batches=False)[0]) for r in range(2)] == [3, 2]
    short = [epoch(*prepared(lambda: DataLoader(torch.arange(7), batch_size=4), r, 2)) for r in range(2)]
    assert short == [[([0, 1, 2, 3], True, 7)], [([4, 5, 6, 0], True, 7)]]  # the short batch filled up too


def test_drop_last_drops_the_incomplete_round():
    make = lambda: DataLoader(torch.arange(10), batch_size=2, drop_last=True)  # noqa: E731
    assert per_rank(make, 2) == [[[[0, 1], [4, 5]]], [[[2, 3], [6, 7]]]]


def test_split_batches_gives_each_rank_its_slice_of_the_global_batch():
    make = lambda: DataLoader(torch.arange(10), batch_size=4)  # noqa: E731
    ranks = [epoch(*prepared(make, r, 2, split_batches=True)) for r in range(2)]
    assert ranks[0] == [([0, 1], False, -1), ([4, 5], False, -1), ([8, 9], True, 2)]
    assert ranks[1] == [([2, 3], False, -1), ([6, 7], False, -1), ([0, 1], True, 2)]
    uneven = per_rank(make, 2, split_batches=True, even_batches=False)
    assert uneven == [[[[0, 1], [4, 5], [8, 9]]], [[[2, 3], [6, 7]]]]


def test_split_batches_with_a_batch_size_that_does_not_divide_is_one_line():
    with pytest.raises(HpcError) as e:
        prepared(lambda: DataLoader(torch.arange(10), batch_size=5), 0, 2, split_batches=True)
    assert "batch size 5 does not divide among 2 processes" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(HpcError, match="split_batches needs the DataLoader's batch size"):
        prepared(MAKERS["batch sampler"], 0, 2, split_batches=True)


# --- streams -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("split", [False, True])
def test_a_stream_is_dealt_like_batches_of_one_process(split):
    make = lambda: DataLoader(Stream(22), batch_size=4)  # noqa: E731
    config = {"dispatch_batches": False, "split_batches": split}
    uneven = per_rank(make, 2, even_batches=False, **config)
    assert [i for b in interleave(uneven) for i in b] == list(range(22))
    even = [epoch(*prepared(make, r, 2, **config)) for r in range(2)]
    with pytest.raises(TypeError):  # a stream of unknown length has none, as with torch's DataLoader
        len(prepared(make, 0, 2, **config)[0])
    if split:  # the short last batch [20, 21] is filled up with the stream's first samples, then cut
        assert [e[-1] for e in even] == [([20, 21], True, 2), ([0, 1], True, 2)] and len(even[1]) == 6
    else:
        assert [e[-1] for e in even] == [([16, 17, 18, 19], True, 6), ([20, 21, 0, 1], True, 6)]


# --- seeds ---------------------------------------------------------------------------------------------
def test_use_seedable_sampler_shuffles_by_data_seed_and_epoch_whatever_the_generator():
    def make(g_seed):
        return lambda: DataLoader(torch.arange(30), batch_size=5, shuffle=True,
                                  generator=torch.Generator().manual_seed(g_seed))

    a = per_rank(make(1), 2, epochs=2, use_seedable_sampler=True, data_seed=11)
    assert a == per_rank(make(2), 2, epochs=2, use_seedable_sampler=True, data_seed=11)  # generator ignored
    assert interleave(a, 0) != interleave(a, 1)  # each epoch reshuffles
    assert per_rank(make(1), 2, use_seedable_sampler=True, data_seed=12)[0] != a[0][:1]
    dl, acc = prepared(make(1), 0, 2, use_seedable_sampler=True, data_seed=11)
    dl.set_epoch(1)
    assert [b for b, _, _ in epoch(dl, acc)] == a[0][1]  # set_epoch picks the epoch's order


def test_a_sampler_without_a_generator_gets_hpcs_seed():
    make = lambda: DataLoader(torch.arange(20), batch_size=4, sampler=SubsetRandomSampler(range(20)))  # noqa: E731
    ranks = per_rank(make, 2, epochs=2, even_batches=False)
    assert sorted(i for b in interleave(ranks) for i in b) == list(range(20))
    assert per_rank(make, 2, epochs=2, even_batches=False) == ranks and interleave(ranks, 0) != interleave(ranks, 1)


def test_the_keyed_shuffle_is_a_reproducible_permutation():
    for n in (2, 41, 1000, 4099):
        order = KeyedShuffle(n, 7).slice(0, n)
        assert sorted(order) == list(range(n)) and order == KeyedShuffle(n, 7).slice(0, n)
    assert KeyedShuffle(1000, 7).slice(0, 1000) != KeyedShuffle(1000, 8).slice(0, 1000) != list(range(1000))


# --- resuming ------------------------------------------------------------------------------------------
RESUMED = {**MAKERS, "shuffle": lambda: DataLoader(torch.arange(23), batch_size=4, shuffle=True),
           "stream": lambda: DataLoader(SizedStream(23), batch_size=4)}


@pytest.mark.parametrize("kind", RESUMED)
@pytest.mark.parametrize("config", [{}, {"even_batches": False}, {"split_batches": True}])
def test_resuming_mid_epoch_gives_exactly_the_rest(kind, config):
    config = {**config, "dispatch_batches": False}
    if config.get("split_batches") and kind == "batch sampler":  # batches of no fixed size cannot be split
        with pytest.raises(HpcError, match="split_batches"):
            prepared(RESUMED[kind], 0, 2, **config)
        return
    make = RESUMED[kind]
    for rank in range(2):
        dl, acc = prepared(make, rank, 2, **config)
        straight = [epoch(dl, acc) for _ in range(3)]
        dl, acc = prepared(make, rank, 2, **config)
        dl.resume_at(2, 1)
        assert len(dl) == len(straight[2])  # the epoch's length, as Accelerate's (scripts divide by it)
        assert epoch(dl, acc) == straight[2][1:] and dl.epoch == 3
        dl.set_epoch(1)
        assert epoch(SkipFirstBatches(dl, 2), acc) == straight[1][2:]


def test_resuming_a_million_batches_into_a_huge_epoch_loads_nothing_skipped_and_is_quick():
    data = Counting(200_000_000)
    for sampler in (None, Reversed(len(data))):
        dl, _ = simulated_rank(lambda: DataLoader(data, batch_size=32, shuffle=sampler is None, sampler=sampler), 0, 2)
        data.loaded = 0
        start = time.perf_counter()
        dl.resume_at(0, 1_000_000)
        first = next(iter(dl))
        took = time.perf_counter() - start
        assert data.loaded == 32 and len(first) == 32 and dl.position == 1_000_001
        if sampler is None:  # O(1); a sampler that can only be iterated is skipped at index speed instead
            assert took < 1.0, took


# --- errors and the stateful loader --------------------------------------------------------------------
def test_use_stateful_dataloader_without_torchdata_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)  # import fails as if not installed
    with pytest.raises(HpcError) as e:
        prepared(MAKERS["default"], 0, 2, use_stateful_dataloader=True)
    assert "pip install torchdata" in str(e.value) and "\n" not in str(e.value)


def test_in_order_false_is_refused():
    with pytest.raises(HpcError, match="in_order=False"):
        prepared(lambda: DataLoader(torch.arange(10), batch_size=2, num_workers=1, in_order=False), 0, 2)


class StatefulStream(IterableDataset):
    def __init__(self, n):
        self.n, self.at, self.read = n, 0, 0

    def __iter__(self):
        while self.at < self.n:
            self.at, self.read = self.at + 1, self.read + 1
            yield self.at - 1
        self.at = 0

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        self.at = state["at"]


def test_a_stateful_stream_resumes_from_its_state_without_reading_the_skipped_part():
    config = {"use_stateful_dataloader": True, "dispatch_batches": False, "even_batches": False}
    make = lambda: DataLoader(StatefulStream(20), batch_size=2)  # noqa: E731
    dl, acc = prepared(make, 1, 2, **config)
    straight = epoch(dl, acc)
    dl, acc = prepared(make, 1, 2, **config)
    it = iter(dl)
    next(it), next(it)
    saved = dl.state_dict()
    dl, acc = prepared(make, 1, 2, **config)
    dl.load_state_dict(saved)
    assert epoch(dl, acc) == straight[2:] and dl.dataset.read == 20 - 8
