"""`accelerate.utils.dataclasses` as hpc spells it: its names, each from the runtime module that defines it."""

from hpc.runtime.configuration import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
from hpc.runtime.handlers import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
)
from hpc.runtime.parallel.compile import TorchDynamoPlugin
from hpc.runtime.process.distributed_type import DistributedType, RNGType
from hpc.runtime.strategies.plugins import DeepSpeedPlugin, FullyShardedDataParallelPlugin

# the other names accelerate.utils takes from this module: hpc.utils's
from hpc.utils import (  # noqa: E402
    AORecipeKwargs,
    BnbQuantizationConfig,
    ComputeEnvironment,
    CustomDtype,
    DeepSpeedSequenceParallelConfig,
    DynamoBackend,
    FP8RecipeKwargs,
    LoggerType,
    MegatronLMPlugin,
    MSAMPRecipeKwargs,
    PrecisionType,
    SageMakerDistributedType,
    TensorInformation,
    TERecipeKwargs,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
    add_model_config_to_megatron_parser,
)

__all__ = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "BnbQuantizationConfig",
    "ComputeEnvironment",
    "CustomDtype",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DeepSpeedSequenceParallelConfig",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MSAMPRecipeKwargs",
    "MegatronLMPlugin",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "SageMakerDistributedType",
    "TERecipeKwargs",
    "TensorInformation",
    "TorchContextParallelConfig",
    "TorchDynamoPlugin",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "add_model_config_to_megatron_parser",
]
