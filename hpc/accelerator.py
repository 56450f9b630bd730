"""`accelerate.accelerator`: `from hpc.accelerator import Accelerator` (the class lives in hpc.runtime), and the
configuration objects Accelerate's module also exports."""

from hpc.runtime.accelerator import Accelerator
from hpc.runtime.configuration import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ["Accelerator", "DataLoaderConfiguration", "GradientAccumulationPlugin", "ProjectConfiguration"]

# what Accelerate's module also binds from its other modules, each from its own hpc path (and its
# `logger`, a multi-process logger of its own)
_ALSO = {
    "hpc.checkpointing": ["load_accelerator_state", "load_custom_state", "save_accelerator_state", "save_custom_state"],
    "hpc.data_loader": ["DataLoaderDispatcher", "prepare_data_loader", "skip_first_batches"],
    "hpc.logging": ["get_logger"],
    "hpc.optimizer": ["AcceleratedOptimizer"],
    "hpc.parallelism_config": ["ParallelismConfig"],
    "hpc.runtime.big_models.hooks": ["get_state_dict_offloaded_model"],
    "hpc.scheduler": ["AcceleratedScheduler"],
    "hpc.state": ["AcceleratorState", "GradientState", "PartialState"],
    "hpc.tracking": ["GeneralTracker", "LOGGER_TYPE_TO_CLASS", "filter_trackers"],
    "hpc.utils": ["AORecipeKwargs", "AutocastKwargs", "DTENSOR_PYTORCH_VERSION", "DeepSpeedEngineWrapper",
                  "DeepSpeedOptimizerWrapper", "DeepSpeedPlugin", "DeepSpeedSchedulerWrapper",
                  "DistributedDataParallelKwargs", "DistributedType", "DummyOptim", "DummyScheduler", "DynamoBackend",
                  "FP8BackendType", "FP8RecipeKwargs", "FSDP2_PYTORCH_VERSION", "FSDP_PYTORCH_VERSION",
                  "FullyShardedDataParallelPlugin", "GradScalerKwargs", "InitProcessGroupKwargs", "KwargsHandler",
                  "LoggerType", "MODEL_NAME", "MSAMPRecipeKwargs", "MegatronEngine", "MegatronLMDummyDataLoader",
                  "MegatronLMDummyScheduler", "MegatronLMOptimizerWrapper", "MegatronLMPlugin",
                  "MegatronLMSchedulerWrapper", "PROFILE_PATTERN_NAME", "PrecisionType", "ProfileKwargs", "RNGType",
                  "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_NAME", "SAFE_WEIGHTS_PATTERN_NAME", "SCALER_NAME",
                  "TERecipeKwargs", "TorchDynamoPlugin", "TorchTensorParallelPlugin", "WEIGHTS_INDEX_NAME",
                  "WEIGHTS_NAME", "WEIGHTS_PATTERN_NAME", "apply_fp8_autowrap", "check_os_kernel",
                  "clean_state_dict_for_safetensors", "compare_versions", "compile_regions",
                  "compile_regions_deepspeed", "compile_regions_fsdp2", "convert_model", "convert_model_to_fp8_ao",
                  "convert_outputs_to_fp32", "ensure_weights_retied", "extract_model_from_parallel", "fsdp2_apply_ac",
                  "fsdp2_canonicalize_names", "fsdp2_prepare_model", "fsdp2_switch_optimizer_parameters", "gather",
                  "gather_object", "get_fsdp2_grad_scaler", "get_grad_scaler", "get_mixed_precision_context_manager",
                  "get_model_tp_size", "get_pretty_name", "has_offloaded_params", "is_bf16_available",
                  "is_bitsandbytes_multi_backend_available", "is_compiled_module", "is_deepspeed_available",
                  "is_lomo_available", "is_megatron_lm_available", "is_mlu_available", "is_msamp_available",
                  "is_musa_available", "is_npu_available", "is_torch_version", "is_torch_xla_available",
                  "is_torchao_available", "is_transformer_engine_available", "is_xpu_available", "load_fsdp_model",
                  "load_fsdp_optimizer", "map_pytorch_optim_to_deepspeed", "megatron_lm_initialize",
                  "megatron_lm_prepare_data_loader", "megatron_lm_prepare_model_optimizer_scheduler",
                  "model_has_dtensor", "pad_across_processes", "parse_choice_from_env", "recursively_apply", "reduce",
                  "release_memory", "save", "save_fsdp_model", "save_fsdp_optimizer", "wait_for_everyone"],
}
_FORWARD = Forwarding(__name__, _ALSO, logger=True)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
