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
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ["BatchSamplerShard", "DataLoaderAdapter", "DataLoaderConfiguration", "DataLoaderDispatcher",
           "DataLoaderShard", "DataLoaderStateMixin", "IterableDatasetShard", "MpDeviceLoaderWrapper",
           "PreparedDataLoader",
           "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader", "SkipFirstBatches", "get_sampler", "logger",
           "prepare_data_loader", "skip_first_batches"]

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.state": ["DistributedType", "GradientState", "PartialState"],
    "hpc.logging": ["get_logger"],
    "hpc.utils": ["RNGType", "broadcast", "broadcast_object_list", "compare_versions", "concatenate",
                 "find_batch_size", "get_data_structure", "initialize_tensors", "is_datasets_available",
                 "is_torch_version", "is_torch_xla_available", "is_torchdata_stateful_dataloader_available",
                 "send_to_device", "slice_tensors", "synchronize_rng_states"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
