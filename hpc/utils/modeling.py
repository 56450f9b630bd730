"""`accelerate.utils.modeling` as hpc spells it: its names, defined in hpc.runtime.big_models."""

from hpc.runtime.big_models.device_map import (
    check_device_map,
    clean_device_map,
    get_balanced_memory,
    infer_auto_device_map,
)
from hpc.runtime.big_models.hooks import align_module_device, has_offloaded_params
from hpc.runtime.big_models.loading import load_checkpoint_in_model, load_state_dict
from hpc.runtime.big_models.module_tensors import (
    get_non_persistent_buffers,
    id_tensor_storage,
    named_module_tensors,
    set_module_tensor_to_device,
)
from hpc.runtime.big_models.offload import load_offloaded_weights
from hpc.runtime.big_models.sizes import (
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
    retie_parameters,
)

__all__ = ['align_module_device', 'calculate_maximum_sizes', 'check_device_map', 'check_tied_parameters_in_config',
           'check_tied_parameters_on_same_device', 'clean_device_map', 'compute_module_sizes',
           'compute_module_total_buffer_size', 'convert_file_size_to_int', 'dtype_byte_size', 'find_tied_parameters',
           'get_balanced_memory', 'get_max_layer_size', 'get_max_memory', 'get_non_persistent_buffers',
           'has_offloaded_params', 'id_tensor_storage', 'infer_auto_device_map', 'load_checkpoint_in_model',
           'load_offloaded_weights', 'load_state_dict', 'named_module_tensors', 'retie_parameters',
           'set_module_tensor_to_device']
