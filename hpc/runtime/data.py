"""Data sharding: every rank gets whole batches, round-robin, so a gather restores the global order.

Batch i of the epoch goes to rank i % world. Without drop_last the last round is padded with samples
from the start, so every rank runs the same number of equally sized batches (no rank waits in a
collective for one that has run out); gather_for_metrics drops that padding again. Shuffling is seeded
by (seed, epoch): a restarted job sees the same order, and skip_first_batches resumes mid-epoch.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from hpc.errors import HpcError


class ShardedBatchSampler:
    def __init__(self, n: int, batch_size: int, rank: int, world: int, shuffle: bool, drop_last: bool, seed: int):
        self.n, self.batch_size, self.rank, self.world = n, batch_size, rank, world
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self.epoch, self.skip = 0, 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    @property
    def rounds(self) -> int:
        per_round = self.batch_size * self.world
        return self.n // per_round if self.drop_last else -(-self.n // per_round)

    @property
    def padding(self) -> int:
        """How many samples the last round repeats from the start of the epoch."""
        return 0 if self.drop_last else self.rounds * self.batch_size * self.world - self.n

    def __len__(self) -> int:
        return self.rounds - self.skip

    def __iter__(self):
        order = self._order()
        total = self.rounds * self.batch_size * self.world
        while len(order) < total:  # a tiny dataset may need its order several times over
            order = order + order[: total - len(order)]
        for r in range(self.skip, self.rounds):
            start = (r * self.world + self.rank) * self.batch_size
            yield order[start:start + self.batch_size]


class PreparedDataLoader:
    """Iterates this rank's shard on the accelerator's device, and tells the accelerator where it is."""

    def __init__(self, loader: DataLoader, accelerator, seed: int):
        if isinstance(loader.dataset, IterableDataset):
            raise HpcError("an IterableDataset cannot be sharded by index", fix="shard it in the dataset itself")
        if loader.batch_size is None:
            raise HpcError("a DataLoader with its own batch_sampler cannot be sharded yet",
                           fix="give batch_size (and shuffle) to the DataLoader instead")
        state = accelerator.state
        self.accelerator = accelerator
        self.sampler = ShardedBatchSampler(len(loader.dataset), loader.batch_size, state.env.rank,
                                           state.env.world_size, isinstance(loader.sampler, RandomSampler),
                                           loader.drop_last, seed)
        # its own generator: starting an iterator draws a seed, which must not move the global RNG (a resumed
        # run starts its iterator mid-epoch, and dropout masks would differ from the uninterrupted run)
        self._generator = torch.Generator()
        self.loader = DataLoader(loader.dataset, batch_sampler=self.sampler, num_workers=loader.num_workers,
                                 generator=self._generator,
                                 collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                                 worker_init_fn=loader.worker_init_fn, persistent_workers=loader.persistent_workers
                                 if loader.num_workers else False)
        self.batch_size = loader.batch_size
        self.dataset = loader.dataset
        self.position = 0  # batches of the current epoch handed out (what a checkpoint records)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.sampler.epoch:  # a resumed position belongs to its own epoch only
            self.sampler.skip = 0
        self.sampler.epoch = epoch

    def resume_at(self, epoch: int, position: int) -> None:
        """The next pass continues epoch `epoch` after its first `position` batches."""
        self.sampler.epoch, self.sampler.skip, self.position = epoch, position, position

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __iter__(self):
        self.accelerator._resume_if_asked()
        gradient = self.accelerator.gradient_state
        n = len(self)
        self.position = self.sampler.skip
        self._generator.manual_seed(self.sampler.seed * 1_000_003 + self.sampler.epoch)
        try:
            for i, batch in enumerate(self.loader):
                last = i == n - 1
                self.position += 1
                gradient.end_of_dataloader = last
                gradient.remainder = (self.batch_size * self.sampler.world - self.sampler.padding) if last else -1
                self.accelerator._beat("batch")
                yield send_to_device(batch, self.accelerator.device)
        finally:
            gradient.end_of_dataloader, gradient.remainder = False, -1
        self.sampler.skip, self.position = 0, 0
        self.sampler.epoch += 1  # the next pass reshuffles; seeded, so a restart repeats it


class SkipFirstBatches:
    """skip_first_batches(dl, n): the rest of the current epoch, without loading the skipped batches."""

    def __init__(self, prepared: PreparedDataLoader, n: int):
        self.prepared, self.n = prepared, n

    def __len__(self) -> int:
        return max(0, len(self.prepared.sampler) - self.n)

    def __iter__(self):
        self.prepared.sampler.skip = self.n
        yield from self.prepared


def send_to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, dict):
        return type(batch)({k: send_to_device(v, device) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        moved = [send_to_device(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch
