"""`accelerate.test_utils.testing` as hpc spells it: its names, defined in hpc.runtime.test_support.testing."""

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

__all__ = ['are_the_same_tensors', 'assert_exception', 'capture_call_output', 'device_count', 'memory_allocated_func',
           'require_cpu', 'skip', 'slow', 'torch_device']
