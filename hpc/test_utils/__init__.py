"""`accelerate.test_utils`: the small regression fixtures and assertion helpers that Accelerate users' own
distributed tests import (RegressionDataset, RegressionModel, are_the_same_tensors, assert_exception, ...).

Loaded on use only: none of it is on the training path.
"""

from hpc.runtime.test_support.testing import (
           are_the_same_tensors,
           assert_exception,
           capture_call_output,
           device_count,
           memory_allocated_func,
           require_cpu,
           skip,
           slow,
           torch_device,
)
from hpc.runtime.test_support.training import RegressionDataset, RegressionModel

__all__ = ["RegressionDataset", "RegressionModel", "are_the_same_tensors", "assert_exception",
           "capture_call_output", "device_count", "memory_allocated_func", "require_cpu", "skip", "slow",
           "torch_device"]
