"""`accelerate.data_loader`: prepare_data_loader (a loader sharded without an Accelerator), skip_first_batches
(to resume mid-epoch) and SeedableRandomSampler."""

from __future__ import annotations

from torch.utils.data import DataLoader, IterableDataset

from hpc.errors import HpcError
from hpc.runtime.configuration import DataLoaderConfiguration
from hpc.runtime.data.prepare import PreparedDataLoader, SkipFirstBatches
from hpc.runtime.data.samplers import SeedableRandomSampler

__all__ = ["SeedableRandomSampler", "prepare_data_loader", "skip_first_batches"]


def prepare_data_loader(dataloader: DataLoader, device=None, num_processes: int | None = None,
                        process_index: int | None = None, split_batches: bool = False, put_on_device: bool = False,
                        rng_types=None, dispatch_batches: bool | None = None, even_batches: bool = True,
                        slice_fn_for_dispatch=None, use_seedable_sampler: bool = False, data_seed: int | None = None,
                        non_blocking: bool = False, use_stateful_dataloader: bool = False, torch_device_mesh=None):
    """This process's share of ``dataloader`` (what Accelerator.prepare gives), without an Accelerator. Unset
    facts come from PartialState(); batches stay on the CPU unless ``put_on_device``."""
    if slice_fn_for_dispatch is not None or torch_device_mesh is not None:
        raise HpcError("prepare_data_loader(slice_fn_for_dispatch/torch_device_mesh) is not supported by hpc",
                       fix="drop it: each rank is sent its own whole batch")
    if rng_types is not None:
        raise HpcError("prepare_data_loader(rng_types=...) is not supported by hpc: the order is seeded by "
                       "(seed, epoch)", fix="drop rng_types")
    if None in (device, num_processes, process_index):
        from hpc.runtime.process.state import PartialState

        state = PartialState()
        device = state.device if device is None else device
        num_processes = state.num_processes if num_processes is None else num_processes
        process_index = state.process_index if process_index is None else process_index
    if not 0 <= process_index < num_processes:
        raise HpcError(f"prepare_data_loader: process_index {process_index} is not below num_processes "
                       f"{num_processes}", fix="pass this process's rank and the world size")
    config = DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=dispatch_batches,
                                     even_batches=even_batches, use_seedable_sampler=use_seedable_sampler,
                                     data_seed=data_seed, non_blocking=non_blocking,
                                     use_stateful_dataloader=use_stateful_dataloader)
    return PreparedDataLoader(dataloader, world=num_processes, rank=process_index,
                              device=device if put_on_device else "cpu", config=config)


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
