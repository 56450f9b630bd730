"""`accelerate.utils` as hpc spells it: `from accelerate.utils import X` becomes `from hpc.utils import X`.

Names load on first use (the submodules import torch and the runtime), as in hpc/__init__.py.
"""

_MODULES = {
    "hpc.utils.operations": ["DistributedOperationException", "copy_tensor_to_devices", "broadcast",
                               "broadcast_object_list", "concatenate", "find_batch_size", "gather", "gather_object",
                               "honor_type", "is_namedtuple", "is_torch_tensor", "listify", "pad_across_processes",
                               "recursively_apply", "reduce", "send_to_device", "slice_tensors"],
    "hpc.runtime.process.random_states": ["set_seed", "synchronize_rng_state", "synchronize_rng_states"],
    "hpc.runtime.training.batch_memory": ["clear_device_cache", "find_executable_batch_size", "release_memory",
                                          "should_reduce_batch_size"],
    "hpc.utils.dataclasses": ["TorchDynamoPlugin", "AutocastKwargs", "DDPCommunicationHookType",
                              "InitProcessGroupKwargs", "KwargsHandler", "ProfileKwargs", "DataLoaderConfiguration",
                              "DeepSpeedPlugin", "DistributedDataParallelKwargs", "DistributedType",
                              "FullyShardedDataParallelPlugin", "GradScalerKwargs", "GradientAccumulationPlugin",
                              "ProjectConfiguration", "RNGType"],
    "hpc.runtime.availability": ["is_bf16_available", "is_cuda_available", "is_datasets_available",
                                 "is_deepspeed_available", "is_fp16_available", "is_fp8_available", "is_hpu_available",
                                 "is_mlu_available", "is_mps_available", "is_npu_available", "is_pytest_available",
                                 "is_rich_available", "is_schedulefree_available", "is_tensorboard_available",
                                 "is_torch_xla_available", "is_transformers_available", "is_wandb_available",
                                 "is_xpu_available"],
    "hpc.runtime.process.state": ["wait_for_everyone"],
    "hpc.runtime.strategies.deepspeed_dummies": ["DummyOptim", "DummyScheduler"],
    "hpc.runtime.parallel.mesh": ["TorchContextParallelConfig", "TorchTensorParallelConfig",
                                  "TorchTensorParallelPlugin"],
    "hpc.runtime.parallel.fp8": ["AORecipeKwargs", "FP8RecipeKwargs", "MSAMPRecipeKwargs", "TERecipeKwargs"],
    "hpc.utils.modeling": ["align_module_device", "calculate_maximum_sizes", "check_device_map",
                           "check_tied_parameters_in_config", "check_tied_parameters_on_same_device",
                           "compute_module_sizes", "convert_file_size_to_int", "dtype_byte_size",
                           "find_tied_parameters", "get_balanced_memory", "get_max_layer_size", "get_max_memory",
                           "has_offloaded_params", "id_tensor_storage", "infer_auto_device_map",
                           "load_checkpoint_in_model", "load_offloaded_weights", "load_state_dict",
                           "named_module_tensors", "retie_parameters", "set_module_tensor_to_device"],
    "hpc.utils.offload": ["OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict",
                          "load_offloaded_weight", "offload_state_dict", "offload_weight", "save_offload_index"],
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}
# the rest of Accelerate's big-model names in accelerate.utils
_LAZY = {**_LAZY, **{name: "hpc.utils.modeling" for name in ("CustomDtype", "SAFE_WEIGHTS_NAME", "WEIGHTS_INDEX_NAME",
                                                                "WEIGHTS_NAME")},
         **{name: "hpc.hooks" for name in ("find_device", "recursive_getattr")}}
__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hpc.utils' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])
