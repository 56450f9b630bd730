"""`accelerate.data_loader`: skip_first_batches, to resume mid-epoch."""

from __future__ import annotations

from torch.utils.data import DataLoader, IterableDataset

from hpc.errors import HpcError
from hpc.runtime.data import PreparedDataLoader, SkipFirstBatches

__all__ = ["skip_first_batches"]


class _SkipBatchSampler:
    """A batch sampler's batches after the first ``skip``: the skipped ones are never loaded."""

    def __init__(self, batch_sampler, skip: int):
        self.batch_sampler, self.skip = batch_sampler, skip

    def __iter__(self):
        for index, batch in enumerate(self.batch_sampler):
            if index >= self.skip:
                yield batch

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)


class _SkipIterating:
    """An iterable dataset's loader after its first ``skip`` batches: they must be read to be passed over."""

    def __init__(self, loader: DataLoader, skip: int):
        self.loader, self.skip = loader, skip

    def __iter__(self):
        for index, batch in enumerate(self.loader):
            if index >= self.skip:
                yield batch


def skip_first_batches(dataloader, num_batches: int = 0):
    """The rest of the dataloader's current epoch after ``num_batches`` batches (prepared by the Accelerator or not)."""
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
        raise HpcError(f"skip_first_batches(num_batches={num_batches!r}) must be a whole number >= 0",
                       fix="use 0 or more")
    if isinstance(dataloader, PreparedDataLoader):
        return SkipFirstBatches(dataloader, num_batches)
    if not isinstance(dataloader, DataLoader):
        raise HpcError(f"skip_first_batches takes a DataLoader, not a {type(dataloader).__name__}",
                       fix="pass a torch DataLoader or one returned by accelerator.prepare()")
    if isinstance(dataloader.dataset, IterableDataset) or dataloader.batch_sampler is None:
        return _SkipIterating(dataloader, num_batches)
    return DataLoader(dataloader.dataset, batch_sampler=_SkipBatchSampler(dataloader.batch_sampler, num_batches),
                      num_workers=dataloader.num_workers, collate_fn=dataloader.collate_fn,
                      pin_memory=dataloader.pin_memory, timeout=dataloader.timeout,
                      worker_init_fn=dataloader.worker_init_fn, generator=dataloader.generator,
                      prefetch_factor=dataloader.prefetch_factor,
                      persistent_workers=dataloader.persistent_workers)
