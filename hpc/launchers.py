"""`accelerate.launchers` as hpc spells it: its names, defined in hpc.runtime.process.notebook_launcher."""

from hpc.runtime.process.notebook_launcher import (
    debug_launcher,
    notebook_launcher,
    test_launch,
)
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ['debug_launcher', 'notebook_launcher', 'test_launch']

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.state": ["AcceleratorState", "PartialState"],
    "hpc.utils": ["ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION", "PrecisionType", "PrepareForLaunch",
                  "are_libraries_initialized", "check_cuda_p2p_ib_support", "get_current_device_type", "get_gpu_info",
                  "is_mps_available", "is_rocm_available", "is_torch_version", "patch_environment"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
