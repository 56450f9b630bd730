"""`accelerate.utils.deepspeed`: reading a DeepSpeed config (HfDeepSpeedConfig), the wrappers Accelerate puts
around DeepSpeed's engine, optimizer and scheduler (under DeepSpeed the engine steps inside backward, so the
optimizer's and scheduler's step do nothing: that is DeepSpeed's contract), and the CPU optimizer for offload."""

from __future__ import annotations

import base64
import copy
import json
import os

from hpc.runtime.process.distributed_type import DistributedType
from hpc.runtime.training.wrappers import AcceleratedOptimizer, AcceleratedScheduler


class HfDeepSpeedConfig:
    """A DeepSpeed config (a dict, a JSON file, a JSON string or base64 of one) with dotted lookups:
    ``get_value("zero_optimization.stage")``, ``is_zero3()``, ``is_offload()``."""

    def __init__(self, config_file_or_dict):
        if isinstance(config_file_or_dict, dict):
            config = copy.deepcopy(config_file_or_dict)
        elif os.path.exists(config_file_or_dict):
            with open(config_file_or_dict, encoding="utf-8") as handle:
                config = json.load(handle)
        else:
            try:
                try:
                    config = json.loads(config_file_or_dict)
                except json.JSONDecodeError:
                    config = json.loads(base64.urlsafe_b64decode(config_file_or_dict).decode("utf-8"))
            except (UnicodeDecodeError, AttributeError, ValueError):
                raise ValueError("Expected a string path to an existing deepspeed config, or a dictionary, or a "
                                 f"base64 encoded string. Received: {config_file_or_dict}") from None
        self.config = config
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        self._stage = self.get_value("zero_optimization.stage", -1)
        devices = {self.get_value("zero_optimization.offload_optimizer.device"),
                   self.get_value("zero_optimization.offload_param.device")}
        self._offload = (self.is_zero2() or self.is_zero3()) and bool(devices & {"cpu", "nvme"})

    def find_config_node(self, ds_key_long: str):
        config, *path = self.config, *ds_key_long.split(".")
        key = path.pop()
        for node in path:
            config = config.get(node)
            if config is None:
                return None, key
        return config, key

    def get_value(self, ds_key_long: str, default=None):
        config, key = self.find_config_node(ds_key_long)
        return default if config is None else config.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        config, parent, node = self.config, None, None
        for node in ds_key_long.split("."):
            parent, config = config, config.get(node)
            if config is None:
                if must_exist:
                    raise ValueError(f"Can't find {ds_key_long} entry in the config: {self.config}")
                return
        if parent is not None:
            parent.pop(node)

    def is_true(self, ds_key_long: str) -> bool:
        value = self.get_value(ds_key_long)
        return False if value is None else bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        value = self.get_value(ds_key_long)
        return False if value is None else not bool(value)

    def is_zero2(self) -> bool:
        return self._stage == 2

    def is_zero3(self) -> bool:
        return self._stage == 3

    def is_offload(self) -> bool:
        return self._offload


class DeepSpeedEngineWrapper:
    """backward through the engine, which also steps at the end of an accumulation window."""

    def __init__(self, engine):
        self.engine = engine

    def backward(self, loss, sync_gradients: bool = True, **kwargs) -> None:
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self):
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """A DeepSpeed optimizer as prepare() hands it back: the engine steps and zeroes it inside backward."""

    def __init__(self, optimizer):
        self.optimizer = self.user_optimizer = optimizer
        self._unscaled = False
        self.__has_overflow__ = hasattr(optimizer, "overflow")

    def zero_grad(self, set_to_none=None):
        return None  # the engine zeroes the gradients after its step in backward

    def step(self, closure=None):
        return None  # the engine stepped in backward

    @property
    def step_was_skipped(self) -> bool:
        """Whether the engine skipped its last step on an fp16 overflow."""
        return bool(self.optimizer.overflow) if self.__has_overflow__ else False


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """A scheduler the DeepSpeed engine steps itself (its step here does nothing)."""

    def __init__(self, scheduler, optimizers):
        self.scheduler, self.optimizers = scheduler, optimizers

    def step(self, *args, **kwargs):
        return None  # the engine stepped the scheduler with the optimizer


def get_active_deepspeed_plugin(state):
    """The DeepSpeedPlugin in use; ValueError when the job does not run DeepSpeed."""
    if state.distributed_type != DistributedType.DEEPSPEED:
        raise ValueError("Couldn't retrieve the active `DeepSpeedPlugin` as none were enabled. Please make sure that "
                         "`Accelerator` is configured for `deepspeed` before calling this function.")
    plugins = getattr(state, "deepspeed_plugins", None)
    if isinstance(plugins, dict):
        return next(plugin for plugin in plugins.values() if getattr(plugin, "selected", True))
    return state.deepspeed_plugin


def map_pytorch_optim_to_deepspeed(optimizer):
    """DeepSpeed's CPU optimizer for ``optimizer`` (Adam/AdamW -> DeepSpeedCPUAdam, Adagrad ->
    DeepSpeedCPUAdagrad), on the same parameter groups, lr and weight decay: what ZeRO offload steps."""
    import torch

    from hpc.runtime.availability import import_deepspeed

    import_deepspeed("cpu")
    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "weight_decay")}
    if isinstance(optimizer, torch.optim.Adagrad):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(optimizer.param_groups, adamw_mode=isinstance(optimizer, torch.optim.AdamW), **defaults)
