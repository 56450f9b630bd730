"""`accelerate.data_loader` as hpc spells it: its names, defined in hpc.runtime.data (adapters: the loader classes
prepare() returns; sampler_shards: the standalone sharding pieces; loader: prepare_data_loader, skip_first_batches)."""

from hpc.runtime.data.adapters import (
    DataLoaderAdapter,
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    MpDeviceLoaderWrapper,
    SkipDataLoader,
    logger,
)
from hpc.runtime.data.loader import (
    DataLoaderConfiguration,
    PreparedDataLoader,
    SeedableRandomSampler,
    SkipFirstBatches,
    prepare_data_loader,
    skip_first_batches,
)
from hpc.runtime.data.sampler_shards import BatchSamplerShard, IterableDatasetShard, SkipBatchSampler, get_sampler

__all__ = ["BatchSamplerShard", "DataLoaderAdapter", "DataLoaderConfiguration", "DataLoaderDispatcher",
           "DataLoaderShard", "DataLoaderStateMixin", "IterableDatasetShard", "MpDeviceLoaderWrapper",
           "PreparedDataLoader",
           "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader", "SkipFirstBatches", "get_sampler", "logger",
           "prepare_data_loader", "skip_first_batches"]
