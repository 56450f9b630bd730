"""`accelerate.state` as hpc spells it: its names, defined in hpc.runtime.process (state, gradient_state,
shared_dict)."""

from hpc.runtime.process.gradient_state import GradientState
from hpc.runtime.process.shared_dict import SharedDict, ThreadLocalSharedDict, do_nothing, logger
from hpc.runtime.process.state import (
    AcceleratorState,
    DistributedType,
    PartialState,
    attach_accelerator,
    check_not_reset,
    distributed_type_of,
    is_initialized,
    wait_for_everyone,
)
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "SharedDict",
           "ThreadLocalSharedDict", "attach_accelerator", "check_not_reset", "distributed_type_of", "do_nothing",
           "is_initialized", "logger", "wait_for_everyone"]

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.utils": ["DynamoBackend", "GradientAccumulationPlugin", "SageMakerDistributedType",
                 "check_cuda_fp8_capability", "check_cuda_p2p_ib_support", "deepspeed_required",
                 "get_cpu_distributed_information", "get_int_from_env", "is_datasets_available",
                 "is_deepspeed_available", "is_fp8_available", "is_habana_gaudi1", "is_hpu_available",
                 "is_mlu_available", "is_mps_available", "is_musa_available", "is_neuron_available",
                 "is_npu_available", "is_sdaa_available", "is_torch_xla_available", "is_xccl_available",
                 "is_xpu_available", "parse_choice_from_env", "parse_flag_from_env", "set_numa_affinity"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
