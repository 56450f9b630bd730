"""accelerate.utils' Megatron-LM names (Accelerate's accelerate/utils/megatron_lm.py and what accelerate.utils
re-exports from it): re-exports only. hpc runs Megatron-LM's layout on torch's own parallelism
(hpc/runtime/strategies/megatron.py); the names of Megatron-LM's own engine exist and say in one line what to use."""

from hpc.runtime.strategies.megatron_plugin import (
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    MegatronEngine,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    MegatronLMOptimizerWrapper,
    MegatronLMPlugin,
    MegatronLMSchedulerWrapper,
    T5TrainStep,
    add_model_config_to_megatron_parser,
    avg_losses_across_data_parallel_group,
    gather_across_data_parallel_groups,
    megatron_lm_initialize,
    megatron_lm_prepare_data_loader,
    megatron_lm_prepare_model_optimizer_scheduler,
    megatron_lm_prepare_optimizer,
    megatron_lm_prepare_scheduler,
)
from hpc.runtime.strategies.megatron_plugin import megatron_lm_initialize as initialize
from hpc.runtime.strategies.megatron_plugin import megatron_lm_prepare_data_loader as prepare_data_loader
from hpc.runtime.strategies.megatron_plugin import (
    megatron_lm_prepare_model_optimizer_scheduler as prepare_model_optimizer_scheduler,
)
from hpc.runtime.strategies.megatron_plugin import megatron_lm_prepare_optimizer as prepare_optimizer
from hpc.runtime.strategies.megatron_plugin import megatron_lm_prepare_scheduler as prepare_scheduler

__all__ = ["AbstractTrainStep", "add_model_config_to_megatron_parser",
           "BertTrainStep", "GPTTrainStep", "MegatronEngine", "MegatronLMDummyDataLoader",
           "MegatronLMDummyScheduler", "MegatronLMOptimizerWrapper", "MegatronLMPlugin", "MegatronLMSchedulerWrapper",
           "T5TrainStep", "avg_losses_across_data_parallel_group", "gather_across_data_parallel_groups",
           "initialize", "megatron_lm_initialize", "megatron_lm_prepare_data_loader",
           "megatron_lm_prepare_model_optimizer_scheduler", "megatron_lm_prepare_optimizer",
           "megatron_lm_prepare_scheduler", "prepare_data_loader", "prepare_model_optimizer_scheduler",
           "prepare_optimizer", "prepare_scheduler"]
