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

__all__ = ['AutocastKwargs', 'DDPCommunicationHookType', 'DataLoaderConfiguration', 'DeepSpeedPlugin',
           'DistributedDataParallelKwargs', 'DistributedType', 'FullyShardedDataParallelPlugin', 'GradScalerKwargs',
           'GradientAccumulationPlugin', 'InitProcessGroupKwargs', 'KwargsHandler', 'ProfileKwargs',
           'ProjectConfiguration', 'RNGType', 'TorchDynamoPlugin']
