"""The one walk over nested data (hpc.runtime.process.nest) and the collectives built on it, in a world of one: every
container comes back as its own type, whichever door it goes through (the 2-rank run of the same nests is in
tests/test_accelerator_methods.py)."""

import collections
import dataclasses
from collections.abc import Mapping

import pytest
import torch

from hpc.errors import HpcError
from hpc.runtime.data.batches import BatchOps
from hpc.runtime.process import collectives, nest

Pair = collections.namedtuple("Pair", "x y")


class Encoding(collections.UserDict):
    """A tokenizer's BatchEncoding: a UserDict with its own .to() and state beside the keys."""

    def __init__(self, data=None, n_sequences=None):
        super().__init__(data)
        self.n_sequences = n_sequences

    def to(self, device, non_blocking=False):
        moved = Encoding({k: v.to(device) for k, v in self.data.items()}, self.n_sequences)
        moved.moved = True
        return moved


class Frozen(Mapping):
    """A Mapping that is no dict, built from one."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


class Keyed(Frozen):
    """A Mapping whose constructor takes something else than a dict."""

    def __init__(self, *, items):
        super().__init__(items)


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    name: str = "kept"


def _nest():
    t = torch.arange(4.0).reshape(2, 2)
    return {"pair": Pair(t, torch.ones(2)), "user": collections.UserDict(a=t), "frozen": Frozen({"b": [t, (t,)]}),
            "ordered": collections.OrderedDict(c=t), "default": collections.defaultdict(list, d=t),
            "out": Out(t), "text": "label"}


def _assert_same_shape(got, want):
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.shape == want.shape
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want) and all(_assert_same_shape(g, w) is None for g, w in zip(got, want))
    elif isinstance(want, Mapping):
        assert list(got) == list(want) and all(_assert_same_shape(got[k], want[k]) is None for k in want)
    elif dataclasses.is_dataclass(want):
        _assert_same_shape(got.logits, want.logits)
        assert got.name == want.name
    else:
        assert got == want


def test_the_walk_rebuilds_every_container_as_its_own_type():
    data = _nest()
    doubled = nest.recursively_apply(lambda t: t * 2, data)
    _assert_same_shape(doubled, data)
    assert doubled["default"].default_factory is list and doubled["frozen"]["b"][1][0].tolist() == [[0, 2], [4, 6]]
    assert doubled["pair"].x is not data["pair"].x and doubled["text"] == "label"
    assert nest.recursively_apply(lambda t, k: t + k, Pair(torch.zeros(1), torch.ones(1)), 1).y.tolist() == [2.0]
    assert type(nest.recursively_apply(lambda t: t, Keyed(items={"a": torch.ones(1)}))) is dict  # its values kept


def test_a_strict_walk_names_what_it_refuses():
    with pytest.raises(HpcError, match="gather got a str"):
        collectives.gather_across({"a": torch.ones(1), "b": "text"}, 2)
    with pytest.raises(HpcError, match="reduce got a NoneType"):
        collectives.reduce_across(Pair(torch.ones(1), None), 1, "sum")


def test_collectives_in_a_world_of_one_keep_the_types():
    data = {k: v for k, v in _nest().items() if k != "text"}
    assert collectives.gather_across(data, 1) is data and collectives.pad_across(data, 1, dim=1) is data
    for reduced in (collectives.reduce_across(data, 1, "sum"), collectives.reduce_across(data, 1)):
        _assert_same_shape(reduced, data)
        assert reduced["pair"].x is not data["pair"].x  # a new tensor, as Accelerate's
    assert nest.truncate(data, 1)["frozen"]["b"][0].shape == (1, 2)
    assert collectives.broadcast_across(data, 1)["user"]["a"] is data["user"]["a"]
    with pytest.raises(HpcError, match="from_process=True"):
        collectives.broadcast_across(data, 2, from_process=True)


def test_send_to_device_calls_to_on_what_has_it_and_walks_the_rest():
    t = torch.ones(2)
    enc = Encoding({"ids": t}, n_sequences=1)
    moved = nest.send_to_device({"enc": enc, "pair": Pair(t, "keep"), "frozen": Frozen({"ids": [t], "x": t}),
                                 "user": collections.UserDict(ids=t)}, "cpu", skip_keys=["ids"])
    assert moved["enc"].moved and moved["enc"].n_sequences == 1  # its own .to(), its state kept
    assert type(moved["pair"]) is Pair and moved["pair"].y == "keep"
    assert type(moved["frozen"]) is Frozen and moved["frozen"]["ids"][0] is t  # skipped at every depth
    assert type(moved["user"]) is collections.UserDict and moved["user"]["ids"] is t


def test_batch_size_concatenate_and_the_loader_cuts_walk_the_same_nests():
    batch = {"name": "file.txt", "pair": Pair(torch.ones(4, 2), ["a", "b", "c", "d"]),
             "enc": collections.UserDict(ids=torch.zeros(4, 3))}
    assert nest.find_batch_size(batch) == 4 and BatchOps.size(batch) == 4
    cut = BatchOps.take(batch, 1, 3)
    assert type(cut["pair"]) is Pair and cut["pair"].y == ["b", "c"] and cut["name"] == "file.txt"
    assert type(cut["enc"]) is collections.UserDict and cut["enc"]["ids"].shape == (2, 3)
    joined = BatchOps.join([cut, BatchOps.take(batch, 0, 1)])
    assert joined["pair"].y == ["b", "c", "a"] and joined["enc"]["ids"].shape == (3, 3)
    both = nest.concatenate([Pair(torch.ones(1), collections.UserDict(a=torch.ones(2))),
                             Pair(torch.zeros(2), collections.UserDict(a=torch.zeros(1)))])
    assert type(both) is Pair and both.x.tolist() == [1, 0, 0] and type(both.y) is collections.UserDict
    with pytest.raises(HpcError, match="concatenate got a str"):
        nest.concatenate([{"a": "x"}, {"a": "y"}])
    with pytest.raises(HpcError, match="no tensor with a batch dim"):
        nest.find_batch_size({"a": torch.tensor(1.0)})


def test_all_tensors_decides_gather_or_gather_object():
    assert nest.all_tensors(Pair(torch.ones(1), collections.UserDict(a=torch.ones(1))))
    assert nest.all_tensors(Frozen({"a": torch.ones(1), "b": []}))  # an empty part gathers as itself
    assert not nest.all_tensors([]) and not nest.all_tensors({"a": torch.ones(1), "b": None})
    assert not nest.all_tensors(Out(torch.ones(1)))  # its name is no tensor: gathered as an object
