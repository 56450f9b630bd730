"""`accelerate.test_utils.training` as hpc spells it: its names, defined in hpc.runtime.test_support.training."""

from hpc.runtime.test_support.training import (
    MRPC_SAMPLES,
    RegressionDataset,
    RegressionModel,
    mocked_dataloaders,
    mocked_dataloaders_for_autoregressive_models,
)

__all__ = ['MRPC_SAMPLES', 'RegressionDataset', 'RegressionModel', 'mocked_dataloaders',
           'mocked_dataloaders_for_autoregressive_models']
