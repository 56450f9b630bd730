"""Accelerate's data-loader classes are what hpc's loaders are, in one process: prepare_data_loader gives a
DataLoaderShard (a DataLoaderDispatcher with dispatch_batches) that is hpc's position-dealt loader, so a state saved
at 2 processes resumes exactly at 3; skip_first_batches gives the loader's own class and moves its position; the
standalone pieces (BatchSamplerShard, IterableDatasetShard, SkipBatchSampler, SkipDataLoader) deal as Accelerate's
tests/test_data_loader.py says. (Accelerator.prepare's types on one process: test_accelerate_names.)"""

import os

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from hpc.data_loader import (
    BatchSamplerShard,
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    IterableDatasetShard,
    MpDeviceLoaderWrapper,
    SkipBatchSampler,
    SkipDataLoader,
    get_sampler,
    prepare_data_loader,
    skip_first_batches,
)
from hpc.errors import HpcError
from hpc.runtime.process import state as shared_state


@pytest.fixture
def one_process(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "ACCELERATE_", "TORCHELASTIC")):
            monkeypatch.delenv(key)
    shared_state.PartialState._reset_state()
    yield
    shared_state.PartialState._reset_state()


def shards(loader, world, **kw):
    return [prepare_data_loader(loader, num_processes=world, process_index=r, **kw) for r in range(world)]


def test_prepared_loaders_are_accelerates_classes_and_keep_the_users_loader(one_process):
    users = DataLoader(list(range(10)), batch_size=2, shuffle=True)
    dl = prepare_data_loader(users, num_processes=2, process_index=1)
    assert type(dl) is DataLoaderShard and isinstance(dl, DataLoader) and isinstance(dl, DataLoaderStateMixin)
    assert dl.base_dataloader is users and dl.dataset is users.dataset and dl.num_workers == 0  # falls through
    assert isinstance(dl.batch_sampler, BatchSamplerShard) and dl.batch_sampler.batch_size == 2
    assert (dl.batch_sampler.num_processes, dl.batch_sampler.process_index) == (2, 1)
    assert get_sampler(dl) is users.sampler and dl.total_batch_size == 4
    flags = [(dl.end_of_dataloader, dl.remainder) for _ in dl]
    assert flags == [(False, -1), (False, -1), (True, 2)]  # 10 samples: the last round holds 2 real ones of 4
    dl.set_epoch(3)
    assert dl.iteration == 3
    dl.batch_sampler.even_batches = False  # what Accelerate's join_uneven_inputs sets
    assert [len(b) for b in dl] == [2, 2] and not dl.layout.even


def test_dispatch_batches_gives_a_dispatcher_and_a_stream_defaults_to_one_on_the_device(one_process):
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(6))

    assert type(prepare_data_loader(DataLoader(range(8), batch_size=2), put_on_device=True,
                                    dispatch_batches=True)) is DataLoaderDispatcher
    dl = prepare_data_loader(DataLoader(Stream(), batch_size=2), put_on_device=True)
    assert type(dl) is DataLoaderDispatcher and [b.tolist() for b in dl] == [[0, 1], [2, 3], [4, 5]]
    assert type(prepare_data_loader(DataLoader(Stream(), batch_size=2))) is DataLoaderShard  # Accelerate's default
    with pytest.raises(HpcError, match="needs put_on_device=True"):
        prepare_data_loader(DataLoader(range(4)), dispatch_batches=True)


def test_skip_first_batches_is_the_loaders_class_and_moves_its_position(one_process):
    dl = prepare_data_loader(DataLoader(list(range(16)), batch_size=2), num_processes=2, process_index=0)
    skipped = skip_first_batches(dl, 2)
    assert type(skipped) is not DataLoaderShard and isinstance(skipped, DataLoaderShard)
    assert isinstance(skipped, DataLoader) and len(skipped) == 2
    it = iter(skipped)
    assert next(it).tolist() == [8, 9]
    assert dl.state_dict()["consumed"] == 12  # the prepared loader's record: 2 rounds skipped + 1 handed, of 4 samples
    assert [b.tolist() for b in it] == [[12, 13]] and dl.epoch == 1


def test_a_state_saved_at_two_processes_resumes_exactly_at_three(one_process):
    loader = DataLoader(list(range(64)), batch_size=2, shuffle=True)
    torch.manual_seed(7)
    before = shards(loader, 2)
    seen = []
    for dl in before:
        for _, batch in zip(range(4), dl):
            seen += batch.tolist()
    state = before[0].state_dict()
    assert state["consumed"] == 16
    after = shards(loader, 3)
    for dl in after:
        assert type(dl) is DataLoaderShard
        dl.load_state_dict(state)
        seen += [i for batch in dl for i in batch.tolist()]
    assert sorted(seen) == list(range(64))  # every sample of the epoch once: none lost, none repeated


@pytest.mark.parametrize("size, batch, split, even, expected", [
    (21, 3, False, True, [[[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19, 20]],
                          [[3, 4, 5], [9, 10, 11], [15, 16, 17], [0, 1, 2]]]),
    (20, 3, False, True, [[[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19, 0]],
                          [[3, 4, 5], [9, 10, 11], [15, 16, 17], [1, 2, 3]]]),
    (22, 3, False, False, [[[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19, 20]], [[3, 4, 5], [9, 10, 11], [15, 16, 17],
                                                                              [21]]]),
    (2, 3, False, True, [[[0, 1, 0]], [[1, 0, 1]]]),
    (22, 4, True, True, [[[0, 1], [4, 5], [8, 9], [12, 13], [16, 17], [20, 21]],
                         [[2, 3], [6, 7], [10, 11], [14, 15], [18, 19], [0, 1]]]),
    (21, 4, True, False, [[[0, 1], [4, 5], [8, 9], [12, 13], [16, 17], [20]],
                          [[2, 3], [6, 7], [10, 11], [14, 15], [18, 19]]]),
])
def test_batch_sampler_shard_deals_as_accelerates(size, batch, split, even, expected):
    """Cases of Accelerate's tests/test_data_loader.py: the last round completed from the epoch's first indices."""
    batch_sampler = BatchSampler(range(size), batch_size=batch, drop_last=False)
    dealt = [BatchSamplerShard(batch_sampler, 2, r, split_batches=split, even_batches=even) for r in range(2)]
    assert [list(d) for d in dealt] == expected
    if not split:
        assert [len(d) for d in dealt] == [len(e) for e in expected]


def test_batch_sampler_shard_of_varying_batches_and_its_refusals():
    dealt = [BatchSamplerShard([[0], [1, 2], [3, 4, 5], [6], [7, 8], [9, 10, 11], [12, 13]], 3, r) for r in range(3)]
    assert [list(d) for d in dealt] == [[[0], [6], [12, 13]], [[1, 2], [7, 8], [0]], [[3, 4, 5], [9, 10, 11], [1, 2]]]
    with pytest.raises(ValueError, match="round multiple"):
        BatchSamplerShard(BatchSampler(range(20), batch_size=3, drop_last=False), 2, 0, split_batches=True)


def test_iterable_dataset_shard_completes_the_last_round_from_the_first():
    parts = [list(IterableDatasetShard(range(10), batch_size=2, num_processes=2, process_index=r)) for r in range(2)]
    assert parts == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 0, 1]]
    parts = [list(IterableDatasetShard(range(10), batch_size=4, num_processes=2, process_index=r, split_batches=True,
                                       drop_last=True)) for r in range(2)]
    assert parts == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_skip_pieces_for_plain_loaders_and_the_xla_wrapper():
    assert list(SkipBatchSampler(BatchSampler(range(16), 4, False), 2)) == [[8, 9, 10, 11], [12, 13, 14, 15]]
    skip = SkipDataLoader(list(range(16)), batch_size=4, skip_batches=2)
    assert isinstance(skip, SkipDataLoader) and isinstance(skip, DataLoader) and len(skip) == 2
    assert [t.tolist() for t in skip] == [[8, 9, 10, 11], [12, 13, 14, 15]]
    plain = skip_first_batches(DataLoader(list(range(16)), batch_size=4), num_batches=3)
    assert type(plain) is DataLoader and [t.tolist() for t in plain] == [[12, 13, 14, 15]]
    built = DataLoaderShard(list(range(16)), batch_size=4, skip_batches=1)
    assert [t.tolist()[0] for t in built] == [4, 8, 12] and built.end_of_dataloader
    with pytest.raises(HpcError, match="needs PyTorch/XLA"):
        MpDeviceLoaderWrapper(built, "cpu")
