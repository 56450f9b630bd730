"""SeedableRandomSampler: a RandomSampler whose order is a function of (seed, epoch) alone.

Every rank, and a restarted job, draws the same order without sharing generator state. Up to 4M samples the
order is exactly Accelerate's (randperm seeded with initial_seed + epoch); above, hpc's position-computable
shuffle, so resuming late in a huge epoch costs nothing (data_order). A prepared loader computes the order
from the same function instead of iterating the sampler.
"""

from __future__ import annotations

import torch
from torch.utils.data import RandomSampler

from hpc.runtime.data import order as data_order


class SeedableRandomSampler(RandomSampler):
    def __init__(self, *args, data_seed: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        # Accelerate's default: the seed torch was last given (set_seed(42) makes it 42)
        self.initial_seed = int(data_seed) if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self, epoch: int):
        """The epoch's sample order, addressable by position."""
        seed = self.initial_seed + epoch
        if not self.replacement and self.num_samples == len(self.data_source):
            return data_order.seeded_shuffle(len(self.data_source), seed)
        return data_order.TensorOrder(data_order.random_sampler_order(self, torch.Generator().manual_seed(seed)))

    def __iter__(self):
        order = self.order(self.epoch)
        for start in range(0, len(order), 4096):
            yield from order.slice(start, start + 4096)
        self.set_epoch(self.epoch + 1)
