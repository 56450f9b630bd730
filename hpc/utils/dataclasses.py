"""`accelerate.utils.dataclasses` as hpc spells it: its names, defined in hpc.runtime.distributed_type."""

from hpc.runtime.distributed_type import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    DistributedType,
    FullyShardedDataParallelPlugin,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
    ProjectConfiguration,
    RNGType,
    TorchDynamoPlugin,
)

__all__ = ['AutocastKwargs', 'DDPCommunicationHookType', 'DataLoaderConfiguration', 'DeepSpeedPlugin',
           'DistributedDataParallelKwargs', 'DistributedType', 'FullyShardedDataParallelPlugin', 'GradScalerKwargs',
           'GradientAccumulationPlugin', 'InitProcessGroupKwargs', 'KwargsHandler', 'ProfileKwargs',
           'ProjectConfiguration', 'RNGType', 'TorchDynamoPlugin']
