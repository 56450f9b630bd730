"""`accelerate.utils.modeling` as hpc spells it: its big-model names, defined in hpc.runtime.big_models."""

from hpc.runtime.big_models.device_map import (
    check_device_map,
    clean_device_map,
    fallback_allocate,
    get_balanced_memory,
    get_module_size_with_ties,
    infer_auto_device_map,
)
from hpc.runtime.big_models.hooks import (
    align_module_device,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
)
from hpc.runtime.big_models.loading import (
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    load_checkpoint_in_model,
    load_state_dict,
)
from hpc.runtime.big_models.module_tensors import (
    check_device_same,
    get_non_persistent_buffers,
    id_tensor_storage,
    named_module_tensors,
    set_module_tensor_to_device,
)
from hpc.runtime.big_models.offload import (
    load_offloaded_weight,
    load_offloaded_weights,
    offload_weight,
    save_offload_index,
)
from hpc.runtime.big_models.sizes import (
    CustomDtype,
    calculate_maximum_sizes,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
    get_module_leaves,
    retie_parameters,
)
from hpc.runtime.training.batch_memory import clear_device_cache

# the other names accelerate.utils takes from this module: hpc.utils's
from hpc.utils import (  # noqa: E402
    get_grad_scaler,
    get_mixed_precision_context_manager,
    is_peft_model,
)

__all__ = [
    "CustomDtype",
    "SAFE_WEIGHTS_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "clear_device_cache",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "fallback_allocate",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_grad_scaler",
    "get_max_layer_size",
    "get_max_memory",
    "get_mixed_precision_context_manager",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "is_peft_model",
    "load_checkpoint_in_model",
    "load_offloaded_weight",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "offload_weight",
    "retie_parameters",
    "save_offload_index",
    "set_module_tensor_to_device",
]
