"""`accelerate.test_utils.testing` as hpc spells it: its names, defined in hpc.runtime.test_support.testing."""

from hpc.runtime.test_support.testing import (
    are_the_same_tensors,
    assert_exception,
    capture_call_output,
    require_cpu,
    skip,
    slow,
)

__all__ = ['are_the_same_tensors', 'assert_exception', 'capture_call_output', 'require_cpu', 'skip', 'slow']
