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
    "hpc.runtime.parallel.mesh": ["ParallelismConfig", "TorchContextParallelConfig", "TorchTensorParallelConfig",
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
    "hpc.runtime.utilities.constants": ["DTENSOR_PYTORCH_VERSION", "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION",
                                        "FSDP2_PYTORCH_VERSION", "FSDP_PYTORCH_VERSION",
                                        "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION", "MODEL_NAME", "OPTIMIZER_NAME",
                                        "PROFILE_PATTERN_NAME", "RNG_STATE_NAME", "SAFE_MODEL_NAME",
                                        "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_PATTERN_NAME", "SAMPLER_NAME",
                                        "SCALER_NAME", "SCHEDULER_NAME", "TORCH_DISTRIBUTED_OPERATION_TYPES",
                                        "TORCH_LAUNCH_PARAMS", "WEIGHTS_PATTERN_NAME",
                                        "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION"],
    "hpc.runtime.tracking.registry": ["LoggerType"],  # the one enum log_with is resolved by
    "hpc.runtime.utilities.enums": ["BnbQuantizationConfig", "ComputeEnvironment", "DeepSpeedSequenceParallelConfig",
                                    "DynamoBackend", "FP8BackendType", "PrecisionType",
                                    "SageMakerDistributedType", "TensorInformation"],
    "hpc.runtime.utilities.environment": ["are_libraries_initialized", "check_cuda_fp8_capability",
                                          "check_cuda_p2p_ib_support", "clear_environment",
                                          "convert_dict_to_env_variables", "get_cpu_distributed_information",
                                          "get_current_device_type", "get_gpu_info", "get_int_from_env",
                                          "parse_choice_from_env", "parse_flag_from_env", "patch_environment",
                                          "purge_accelerate_environment", "set_numa_affinity", "str_to_bool"],
    "hpc.runtime.utilities.versions": ["compare_versions", "is_torch_version"],
    "hpc.runtime.utilities.models": ["check_os_kernel", "clean_state_dict_for_safetensors", "compile_regions",
                                     "compile_regions_deepspeed", "compile_regions_fsdp2", "convert_bytes",
                                     "extract_model_from_parallel", "get_grad_scaler",
                                     "get_mixed_precision_context_manager", "get_model_tp_size",
                                     "get_module_children_bottom_up", "get_pretty_name", "has_compiled_regions",
                                     "is_compiled_module", "is_peft_model", "is_port_in_use", "load", "merge_dicts",
                                     "model_has_dtensor", "save"],
    "hpc.runtime.utilities.config_file": ["write_basic_config"],
    "hpc.runtime.utilities.tensor_structures": ["CannotPadNestedTensorWarning", "GatheredParameters",
                                                "convert_outputs_to_fp32", "convert_to_fp32", "get_data_structure",
                                                "ignorant_find_batch_size", "initialize_tensors",
                                                "is_tensor_information", "pad_input_tensors"],
    "hpc.runtime.utilities.deepspeed_parts": ["DeepSpeedEngineWrapper", "DeepSpeedOptimizerWrapper",
                                              "DeepSpeedSchedulerWrapper", "HfDeepSpeedConfig",
                                              "get_active_deepspeed_plugin", "map_pytorch_optim_to_deepspeed"],
    "hpc.runtime.utilities.fsdp_files": ["disable_fsdp_ram_efficient_loading", "enable_fsdp_ram_efficient_loading",
                                         "ensure_weights_retied", "fsdp2_apply_ac", "fsdp2_canonicalize_names",
                                         "fsdp2_load_full_state_dict", "fsdp2_prepare_model",
                                         "fsdp2_switch_optimizer_parameters", "get_fsdp2_grad_scaler",
                                         "load_fsdp_model", "load_fsdp_optimizer", "merge_fsdp_weights",
                                         "save_fsdp_model", "save_fsdp_optimizer"],
    "hpc.runtime.utilities.launch_env": ["PrepareForLaunch", "prepare_deepspeed_cmd_env", "prepare_multi_gpu_env",
                                         "prepare_sagemager_args_inputs", "prepare_simple_launcher_cmd_env",
                                         "prepare_tpu"],
    "hpc.runtime.utilities.other_platforms": ["apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model",
                                              "convert_model_to_fp8_ao", "filter_first_and_last_linear_layers",
                                              "has_4bit_bnb_layers", "has_ao_layers", "has_transformer_engine_layers",
                                              "install_xla", "load_and_quantize_model"],
    "hpc.runtime.utilities.progress": ["tqdm"],
    "hpc.runtime.utilities.probes": ["deepspeed_required", "is_4bit_bnb_available", "is_8bit_bnb_available",
                                     "is_aim_available", "is_amdsmi_available",
                                     "is_bitsandbytes_multi_backend_available", "is_bnb_available",
                                     "is_boto3_available", "is_clearml_available", "is_comet_ml_available",
                                     "is_dvclive_available", "is_habana_gaudi1", "is_import_timer_available",
                                     "is_lomo_available", "is_matplotlib_available", "is_megatron_lm_available",
                                     "is_mlflow_available", "is_msamp_available", "is_musa_available",
                                     "is_neuron_available", "is_pandas_available", "is_peft_available",
                                     "is_pippy_available", "is_pynvml_available", "is_rocm_available",
                                     "is_sagemaker_available", "is_sdaa_available", "is_swanlab_available",
                                     "is_timm_available", "is_torchao_available", "is_torchdata_available",
                                     "is_torchdata_stateful_dataloader_available", "is_torchvision_available",
                                     "is_trackio_available", "is_transformer_engine_available",
                                     "is_transformer_engine_mxfp8_available", "is_triton_available",
                                     "is_weights_only_available", "is_xccl_available", "torchao_required"],
    # built on the megatron branch (hpc.utils.megatron_lm): Accelerate's Megatron-LM names
    "hpc.utils.megatron_lm": ["AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "MegatronEngine",
                              "MegatronLMDummyDataLoader", "MegatronLMDummyScheduler", "MegatronLMOptimizerWrapper",
                              "MegatronLMPlugin", "MegatronLMSchedulerWrapper", "T5TrainStep",
                              "add_model_config_to_megatron_parser", "avg_losses_across_data_parallel_group",
                              "gather_across_data_parallel_groups", "megatron_lm_initialize",
                              "megatron_lm_prepare_data_loader", "megatron_lm_prepare_model_optimizer_scheduler",
                              "megatron_lm_prepare_optimizer", "megatron_lm_prepare_scheduler"],
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
