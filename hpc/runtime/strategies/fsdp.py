"""FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded over the ranks.

FULL_SHARD reshards after forward; SHARD_GRAD_OP keeps parameters gathered between forward and backward;
NO_SHARD and HYBRID_SHARD use a 2-D mesh (replicate x shard): (world x 1), and (nodes x local ranks).
With a ParallelismConfig the mesh is its (dp_replicate x dp_shard x cp x tp): FSDP shards over "dp_shard_cp",
replicating over "dp_replicate" (HSDP): one code path for HSDP whichever way it was asked for, since both end in
fully_shard over a (replicate, shard) mesh. Both meshes are built in parallel/mesh.py; parallel/parallelize.py
applies the rest (fp8, context and tensor parallelism, activation checkpointing, compile) around this strategy's
own steps: the placement (sync_module_states), fully_shard with the plugin's policy, and the optimizers re-pointed
at the shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from hpc.errors import HpcError
from hpc.runtime.parallel.mesh import plugin_mesh
from hpc.runtime.parallel.parallelize import ModelSettings, parallelize
from hpc.runtime.strategies.base import Strategy
from hpc.runtime.strategies.plugins import FullyShardedDataParallelPlugin

_CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class FSDPStrategy(Strategy):
    name = "fsdp"
    needs_process_group = True
    shards_parameters = True

    def __init__(self, state, handlers, plugin: FullyShardedDataParallelPlugin | None, parallelism=None,
                 tp_plan: dict | None = None, **settings):
        super().__init__(state, handlers, **settings)
        self.plugin = plugin or FullyShardedDataParallelPlugin()
        self.parallelism, self.tp_plan = parallelism, tp_plan
        self.device_mesh = parallelism.get_device_mesh(state.device.type) if parallelism is not None else None
        self.context_parallel = None
        if parallelism is not None and parallelism.cp_enabled:
            from hpc.runtime.parallel.context_parallel import ContextParallel

            self.context_parallel = ContextParallel(parallelism, state.device.type)
        self._new_params: dict[int, torch.nn.Parameter] = {}  # id(original parameter) -> its sharded successor
        self._optimizers: list[torch.optim.Optimizer] = []

    # --- preparing ----------------------------------------------------------------------------------
    def data_parallel(self) -> tuple[int, int]:
        if self.device_mesh is None:
            return super().data_parallel()
        if not self.parallelism.dp_dim_names:  # tensor parallelism alone: every rank takes the same batches
            return 1, 0
        dp = self.parallelism.submesh("dp")
        return dp.size(), dp.get_local_rank()

    def mesh(self):
        """What fully_shard shards over: (dp_replicate x) dp_shard x cp, HSDP or FSDP, None under tensor parallelism
        alone; without a ParallelismConfig the one the plugin's sharding_strategy asks for."""
        if self.device_mesh is not None:
            return self.parallelism.sharding_mesh()
        env = self.state.env
        return plugin_mesh(self.plugin.sharding_strategy, env.world_size, env.local_world_size, self.state.device.type)

    def _policy(self) -> dict:
        plugin = self.plugin
        reshard = plugin.reshard_after_forward
        if reshard is None:
            reshard = plugin.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")
        mp = plugin.mixed_precision_policy
        if mp is None and self.mixed_precision in _DTYPES:
            # compute in low precision, reduce gradients in fp32: sums over many ranks stay accurate
            mp = MixedPrecisionPolicy(param_dtype=_DTYPES[self.mixed_precision], reduce_dtype=torch.float32)
        policy = {"mesh": self.mesh(), "reshard_after_forward": reshard}
        if mp is not None:
            policy["mp_policy"] = mp
        if plugin.cpu_offload:
            policy["offload_policy"] = CPUOffloadPolicy(pin_memory=self.state.device.type == "cuda")
        return policy

    def _wrap_here(self, module: torch.nn.Module, layer_names: set[str]) -> bool:
        plugin = self.plugin
        if plugin.auto_wrap_policy == "TRANSFORMER_AUTO_WRAP":
            return type(module).__name__ in layer_names
        if plugin.auto_wrap_policy == "SIZE_BASED_WRAP":
            own = sum(p.numel() for p in module.parameters() if not isinstance(p, torch.distributed.tensor.DTensor))
            return own >= plugin.min_num_params
        return False

    def wrap_model(self, model, settings: ModelSettings):
        if isinstance(model, FSDPModule):  # sharded already: the precision and compile prepare() gives, no more
            return parallelize(model, None, settings, unwrap=self.unwrap)
        plugin = self.plugin
        layer_names = set(plugin.transformer_cls_names_to_wrap or getattr(model, "_no_split_modules", None) or [])
        names: dict[int, str] = {}  # id(parameter) -> its name, as the optimizers hold them before fully_shard

        def place(m):  # after fp8's conversion, as before parallelize: the names and classes are its
            names.update({id(p): n for n, p in m.named_parameters()})
            self._check_layers(m, layer_names)
            return self._place(m)

        # tensor parallelism alone: nothing to shard, and (as before parallelize) no activation checkpointing
        tensor_parallel_only = self.device_mesh is not None and self.mesh() is None
        settings = dataclasses.replace(
            settings, context_parallel=self.context_parallel, tp_plan=self.tp_plan,
            activation_checkpointing=plugin.activation_checkpointing and not tensor_parallel_only,
            checkpoint_layers=frozenset(layer_names))
        model = parallelize(model, self.parallelism if self.device_mesh is not None else None, settings, place=place,
                            shard=None if tensor_parallel_only else lambda m: self._shard(m, layer_names),
                            unwrap=self.unwrap)
        # activation checkpointing's wrappers add a prefix to the names of what they wrap
        now = {(n if tensor_parallel_only else n.replace(_CHECKPOINT_PREFIX, "")): p
               for n, p in model.named_parameters()}
        for old_id, name in names.items():
            self._new_params[old_id] = now[name]
        for opt in self._optimizers:
            self._switch(opt)
        return model

    def _check_layers(self, model, layer_names: set[str]) -> None:
        if self.plugin.auto_wrap_policy != "TRANSFORMER_AUTO_WRAP":
            return
        present = {type(m).__name__ for m in model.modules()}
        missing = sorted(layer_names - present)
        if missing:
            raise HpcError(f"TRANSFORMER_AUTO_WRAP: layer class {', '.join(missing)} is not in the model",
                           fix="name the block class in transformer_cls_names_to_wrap "
                           f"(the model has {', '.join(sorted(present)[:8])})")
        if not layer_names and self.state.env.rank == 0:  # Accelerate's policy then matches the root alone
            print(f"hpc: note: TRANSFORMER_BASED_WRAP: {type(model).__name__} names no layer class (no "
                  "transformer_cls_names_to_wrap, no _no_split_modules): the whole model is sharded as one unit",
                  file=sys.stderr, flush=True)

    def _place(self, model):
        """sync_module_states: rank 0's weights on every rank (meta weights materialized first); the device."""
        if self.plugin.sync_module_states:
            self._materialize(model)
        if not self.plugin.cpu_offload:
            model = model.to(self.state.device)
        if self.plugin.sync_module_states:
            self._broadcast_from_rank0(model)
        return model

    def _shard(self, model, layer_names: set[str]):
        """fully_shard with the plugin's policy, innermost first: a block is sharded before the module holding it."""
        plugin = self.plugin
        policy = self._policy()
        if plugin.ignored_modules:
            ignored = plugin.ignored_modules
            if isinstance(ignored, str):  # Accelerate's: a pattern the modules' qualified names match whole
                ignored = [m for name, m in model.named_modules() if re.fullmatch(ignored, name)]
            ignored = [ignored] if isinstance(ignored, torch.nn.Module) else list(ignored)
            policy["ignored_params"] = {p for m in ignored for p in m.parameters()}
        for module in reversed(list(model.modules())):
            if module is not model and self._wrap_here(module, layer_names):
                fully_shard(module, **policy)
        fully_shard(model, **policy)
        return model

    def _materialize(self, model: torch.nn.Module) -> None:
        """A rank that built the model on the meta device (rank 0 alone loaded the pretrained weights) gets
        storage for it; rank 0's weights arrive by broadcast."""
        if not any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            return
        if self.state.env.rank == 0:
            raise HpcError("sync_module_states: rank 0's model is on the meta device; it must hold the weights",
                           fix="load the weights on rank 0 (cpu_ram_efficient_loading loads them there only)")
        device = "cpu" if self.plugin.cpu_offload else self.state.device
        if self.plugin.param_init_fn is not None:  # the user's own materialization, module by module
            for module in model.modules():
                if any(t.is_meta for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]):
                    self.plugin.param_init_fn(module)
            model.to(device)
        else:
            model.to_empty(device=device)
        if callable(getattr(model, "tie_weights", None)):  # to_empty unties shared weights (transformers re-ties)
            model.tie_weights()

    def _broadcast_from_rank0(self, model: torch.nn.Module) -> None:
        if not dist.is_initialized():
            return
        tensors = [*model.parameters(), *model.buffers()]
        counts = [None] * dist.get_world_size()
        dist.all_gather_object(counts, len(tensors))
        if len(set(counts)) > 1:  # one broadcast per tensor: different counts would pair the wrong tensors
            raise HpcError(f"sync_module_states: the ranks' models hold different numbers of tensors ({counts})",
                           fix="build the same model on every rank (tied weights tied on every rank)")
        device = self.state.device
        with torch.no_grad():
            for tensor in tensors:
                if tensor.device == device:
                    dist.broadcast(tensor.data, src=0)
                else:  # offloaded to the CPU: NCCL broadcasts device memory only
                    on_device = tensor.data.to(device)
                    dist.broadcast(on_device, src=0)
                    tensor.data.copy_(on_device)

    def prepare(self, models, optimizers, hints, settings: ModelSettings):
        wrapped = [self.wrap_model(m, settings) for m in models]
        for opt in optimizers:
            self._switch(opt)
            self._optimizers.append(opt)
        return wrapped, optimizers

    def _switch(self, optimizer: torch.optim.Optimizer) -> None:
        """fully_shard replaces parameters; an optimizer built on the originals must update the shards."""
        for group in optimizer.param_groups:
            group["params"] = [self._new_params.get(id(p), p) for p in group["params"]]

    def grad_scaler(self, device_type: str, **kwargs):
        # every rank must agree on skipping: found-inf is all-reduced over the shards
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device_type, **kwargs)

    # --- the step -----------------------------------------------------------------------------------
    def backward(self, loss, scaler, **kwargs) -> None:
        if self.context_parallel is not None:
            self.context_parallel.before_backward()
        super().backward(loss, scaler, **kwargs)

    def no_sync(self, model):
        if self.plugin.sync_each_microstep or not isinstance(model, FSDPModule):
            return contextlib.nullcontext()
        return _gradient_sync_off(model)

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2.0):
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if self.device_mesh is not None:  # gradients on several meshes (tp x dp layers, dp-only norms)
            return _clip_over_meshes(parameters, max_norm, float(norm_type))
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    # --- weights out --------------------------------------------------------------------------------
    def checkpoint_format(self):
        from hpc.runtime.checkpoint.formats import DcpFormat

        return DcpFormat(self)

    def full_state_dict(self, model):
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)


def _clip_over_meshes(parameters: list, max_norm: float, norm_type: float) -> torch.Tensor:
    """The total gradient norm over every rank's shards, mesh by mesh (a DTensor's norm is only defined among
    DTensors of its own mesh), then every gradient scaled by the same factor."""
    from torch.distributed.tensor import DTensor

    grads: dict = {}
    for p in parameters:
        if p.grad is not None:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            grads.setdefault(key, []).append(p.grad)
    parts = []
    for group in grads.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type)
        parts.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not parts:
        return torch.tensor(0.0)
    if norm_type == float("inf"):
        total = torch.stack(parts).max()
    else:
        total = torch.stack([p.float() ** norm_type for p in parts]).sum() ** (1.0 / norm_type)
    coefficient = max_norm / (float(total) + 1e-6)  # torch's own epsilon
    if coefficient < 1.0:
        for group in grads.values():
            torch._foreach_mul_(group, coefficient)
    return total


@contextlib.contextmanager
def _gradient_sync_off(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
