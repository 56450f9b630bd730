"""`accelerate.data_loader`: prepare_data_loader (a loader sharded without an Accelerator), skip_first_batches
(to resume mid-epoch) and SeedableRandomSampler."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from hpc.errors import HpcError
from hpc.runtime.configuration import DataLoaderConfiguration
from hpc.runtime.data.adapters import SkipDataLoader, prepared_loader
from hpc.runtime.data.prepare import PreparedDataLoader, SkipFirstBatches
from hpc.runtime.data.sampler_shards import SkipBatchSampler
from hpc.runtime.data.samplers import SeedableRandomSampler

__all__ = ["DataLoaderConfiguration", "PreparedDataLoader", "SeedableRandomSampler", "SkipFirstBatches",
           "prepare_data_loader", "skip_first_batches"]


def prepare_data_loader(dataloader: DataLoader, device=None, num_processes: int | None = None,
                        process_index: int | None = None, split_batches: bool = False, put_on_device: bool = False,
                        rng_types=None, dispatch_batches: bool | None = None, even_batches: bool = True,
                        slice_fn_for_dispatch=None, use_seedable_sampler: bool = False, data_seed: int | None = None,
                        non_blocking: bool = False, use_stateful_dataloader: bool = False, torch_device_mesh=None):
    """This process's share of ``dataloader`` (what Accelerator.prepare gives: a DataLoaderShard, or a
    DataLoaderDispatcher with ``dispatch_batches``), without an Accelerator. Unset facts come from PartialState();
    batches stay where they are loaded unless ``put_on_device``. As Accelerate's, rank 0 reads for all
    (``dispatch_batches``) only when asked, or by default for an iterable dataset put on the device."""
    if dispatch_batches is None:
        dispatch_batches = put_on_device and isinstance(dataloader.dataset, IterableDataset)
    if dispatch_batches and not put_on_device:
        raise HpcError("prepare_data_loader(dispatch_batches=True) needs put_on_device=True: rank 0 sends each "
                       "process its batch on the process's device", fix="pass put_on_device=True")
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
    return prepared_loader(dataloader, config, world=num_processes, rank=process_index,
                           device=device if put_on_device else None, seed=_torch_seed(num_processes))


def _torch_seed(world: int) -> int:
    """The order's seed without an Accelerator: torch's (set_seed(21) and set_seed(42) shuffle differently, as
    Accelerate's loaders, which draw from torch's generator), rank 0's where the ranks were seeded apart."""
    seed = torch.initial_seed() % 2**31  # epoch_seed multiplies it: kept within a generator's seed range
    if world > 1 and dist.is_available() and dist.is_initialized():
        box = [seed]
        dist.broadcast_object_list(box, src=0)
        seed = box[0]
    return seed


# the DataLoader keywords a rebuilt loader takes from the original (Accelerate's list, torch 2.0 onward)
_LOADER_KEYWORDS = {"num_workers": 0, "collate_fn": None, "pin_memory": False, "timeout": 0, "worker_init_fn": None,
                    "multiprocessing_context": None, "generator": None, "prefetch_factor": 2,
                    "persistent_workers": False, "pin_memory_device": ""}


def _loader_keywords(loader: DataLoader) -> dict:
    out = {key: getattr(loader, key, default) for key, default in _LOADER_KEYWORDS.items()}
    if not out["num_workers"]:
        out["prefetch_factor"] = None  # torch refuses a prefetch factor without workers
    return out


def skip_first_batches(dataloader, num_batches: int = 0):
    """The rest of the dataloader's current epoch after ``num_batches`` batches. A prepared loader gives an object of
    its own class (DataLoaderShard or DataLoaderDispatcher) that shares its state; a plain DataLoader a DataLoader
    over a SkipBatchSampler, or for an iterable dataset a SkipDataLoader (which reads the skipped batches)."""
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
        raise HpcError(f"skip_first_batches(num_batches={num_batches!r}) must be a whole number >= 0",
                       fix="use 0 or more")
    if isinstance(dataloader, PreparedDataLoader):
        return SkipFirstBatches(dataloader, num_batches)
    if not isinstance(dataloader, DataLoader):
        raise HpcError(f"skip_first_batches takes a DataLoader, not a {type(dataloader).__name__}",
                       fix="pass a torch DataLoader or one returned by accelerator.prepare()")
    keywords = _loader_keywords(dataloader)
    if isinstance(dataloader.dataset, IterableDataset) or dataloader.batch_sampler is None:
        return SkipDataLoader(dataloader.dataset, skip_batches=num_batches, batch_size=dataloader.batch_size,
                              drop_last=dataloader.drop_last,
                              **({"sampler": dataloader.sampler} if dataloader.batch_sampler is None and not
                                 isinstance(dataloader.dataset, IterableDataset) else {}), **keywords)
    return DataLoader(dataloader.dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches),
                      **keywords)
