"""`accelerate.data_loader` as hpc spells it: its names, defined in hpc.runtime.data.loader."""

from hpc.runtime.data.loader import (
    DataLoaderConfiguration,
    PreparedDataLoader,
    SeedableRandomSampler,
    SkipFirstBatches,
    prepare_data_loader,
    skip_first_batches,
)

__all__ = ['DataLoaderConfiguration', 'PreparedDataLoader', 'SeedableRandomSampler', 'SkipFirstBatches',
           'prepare_data_loader', 'skip_first_batches']
