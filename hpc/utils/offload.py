"""`accelerate.utils.offload` as hpc spells it: its names, defined in hpc.runtime.big_models.offload."""

from hpc.runtime.big_models.offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)

__all__ = ['OffloadedWeightsLoader', 'PrefixedDataset', 'extract_submodules_state_dict', 'load_offloaded_weight',
           'offload_state_dict', 'offload_weight', 'save_offload_index']
