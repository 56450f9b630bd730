"""Megatron-LM's layout (distributed_type MEGATRON_LM, MegatronLMPlugin) on torch's own parallelism.

One mesh over the job's ranks, outermost first: pp x dp_replicate x dp_shard x tp (tp innermost, within a node, as
Megatron-LM's). tp_degree and pp_degree are the plugin's; the data-parallel ranks are what is left, all in
dp_shard with use_distributed_optimizer (parameters, gradients and optimizer state sharded over them: FSDP2, ZeRO-3)
and all in dp_replicate without (HSDP with one shard: every data-parallel rank holds its stage's whole tensor
shards, gradients averaged). The model goes through parallelize() like every other strategy's: placed, split to
this rank's pipeline stage (parallel/pipeline.py), cut by Megatron's tensor plan with or without sequence
parallelism (the family's plan: tensor_parallel.decoder_plan, conv1d_parallel.gpt2_plan), its blocks recomputed in
backward (recompute_activations), sharded over the data dimension. Under pp_degree > 1, the prepared model's forward
in training runs the pipeline schedule over num_micro_batches micro-batches (forward and backward) and returns the
loss; backward() then has nothing left to do, and the optimizer steps what the schedule left.

What differs from Accelerate's integration: the model is the transformers model itself (the script's own weights,
not Megatron-LM's re-created ones), split and cut by torch; the loader's batch (per_device_train_batch_size) is what
the micro-batches split, so global_batch_size is that batch times the data-parallel ranks.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist

from hpc.errors import HpcError
from hpc.runtime.parallel import decoder_families
from hpc.runtime.parallel import pipeline as pp
from hpc.runtime.parallel.parallelize import ModelSettings, parallelize
from hpc.runtime.strategies.base import Strategy
from hpc.runtime.strategies.megatron_plugin import MegatronLMPlugin

_CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."


class _TensorMesh:
    """What parallelize() reads of a mesh for its tensor-parallel step."""

    def __init__(self, device_mesh, tp: int):
        self.device_mesh, self.tp_enabled = device_mesh, tp > 1

    def submesh(self, name: str):
        return self.device_mesh[name]


class MegatronModel(torch.nn.Module):
    """The prepared model: this rank's stage of the model (``module``), run by the pipeline's schedule in training,
    returning transformers' CausalLMOutput (loss; logits where the last stage holds them)."""

    def __init__(self, module: torch.nn.Module, strategy: "MegatronStrategy", pipeline: pp.Pipeline | None):
        super().__init__()
        self.module, self._strategy, self._pipeline = module, strategy, pipeline
        self.config = getattr(module, "config", None)

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        if input_ids is None:
            raise HpcError("the Megatron-LM layout runs a model on input_ids", fix="pass input_ids (and labels)")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise HpcError("the Megatron-LM layout runs whole causal sequences: the batch has padding",
                           fix="group the texts into full blocks (as run_clm's group_texts does)")
        if self._pipeline is None:
            logits = self.module(input_ids)
            loss = pp.causal_lm_loss(logits, labels) if labels is not None else None
            return CausalLMOutputWithPast(loss=loss, logits=logits)
        if labels is None:
            raise HpcError("a pipelined model computes its loss on the last stage: it needs labels",
                           fix="pass labels (input_ids for a causal LM)")
        train = self.training and torch.is_grad_enabled()
        loss, logits = self._pipeline.run(input_ids, labels, train)
        self._strategy.scheduled_backward = train
        # return_logits: the last stage's (as Accelerate's: where the logits are); None elsewhere
        return CausalLMOutputWithPast(loss=loss, logits=logits if self._strategy.plugin.return_logits else None)

    @torch.no_grad()
    def megatron_generate(self, inputs, attention_mask=None, max_length=None, max_new_tokens=None, num_beams=None,
                          temperature=None, top_k=None, top_p=None, length_penalty=None, **kwargs):
        """Accelerate's megatron_generate, greedy: each new token the argmax of the last position's logits, the
        whole sequence run through every stage again (right-padded to a multiple of the tp ranks under sequence
        parallelism; causal attention leaves the real positions unchanged). The prompt and the new tokens, on every
        rank."""
        if (num_beams or 1) > 1 or (top_k or 0) > 1 or (top_p or 0) > 0:  # Megatron's greedy: top_k 0, top_p 0
            raise HpcError("megatron_generate: hpc decodes greedily (no beams, no sampling)",
                           fix="leave num_beams, top_k and top_p unset")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise HpcError("megatron_generate: prompts of one length, without padding",
                           fix="generate each length's prompts together")
        if max_new_tokens is None:
            if max_length is None:
                raise HpcError("megatron_generate needs max_new_tokens or max_length", fix="pass max_new_tokens=...")
            max_new_tokens = max_length - inputs.shape[1]
        was_training = self.training
        self.eval()
        ids = inputs.to(self._strategy.state.device)
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self._strategy.next_token(self.module, ids)], dim=1)
        self.train(was_training)
        return ids


class TiedHead:
    """A head tied to the embeddings, split over a pipeline: the first stage's embedding weight and the last stage's
    copy as the head's weight, trained as one parameter (Megatron-LM's embedding group): before each optimizer step
    their gradients are summed between the two stages (each data and tensor rank with its counterpart), so both
    take the same step from the same start."""

    def __init__(self, module, kind, device_mesh, stage: int, stages: int):
        mesh = device_mesh.mesh  # pp x dp_replicate x dp_shard x tp: ranks
        self.group = None
        for first, last in zip(mesh[0].reshape(-1).tolist(), mesh[stages - 1].reshape(-1).tolist()):
            group = dist.new_group([first, last])  # every rank makes every group, in the same order
            if dist.get_rank() in (first, last):
                self.group = group
        trunk = decoder_families.base(module, kind)
        self.mine = (getattr(trunk, kind.embeddings[0]).weight if stage == 0
                     else module.lm_head.weight if stage == stages - 1 else None)
        self.copy = module.lm_head.weight if stage == stages - 1 else None

    def sum_gradients(self) -> None:
        if self.mine is None or self.mine.grad is None:
            return
        grad = self.mine.grad
        placements = getattr(self.mine, "placements", None)
        if placements is not None and grad.placements != placements:
            # an embedding cut by vocabulary may leave its gradient whole (Replicate) under sequence parallelism:
            # the shard of it this rank's counterpart holds, before the sum
            grad = self.mine.grad = grad.redistribute(grad.device_mesh, placements)
        dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=self.group)


class MegatronStrategy(Strategy):
    name = "megatron"
    needs_process_group = True

    def __init__(self, state, handlers, plugin: MegatronLMPlugin | None, **settings):
        super().__init__(state, handlers, **settings)
        from torch.distributed.device_mesh import init_device_mesh

        self.plugin = plugin = plugin if plugin is not None else MegatronLMPlugin()
        world, tp, stages = state.world_size, plugin.tp_degree, plugin.pp_degree
        if world % (tp * stages):
            raise HpcError(f"MegatronLMPlugin tp_degree {tp} x pp_degree {stages} does not divide the job's {world} "
                           "processes", fix="make the processes a multiple of tp_degree x pp_degree")
        if self.accumulation_steps != 1:
            raise HpcError(f"gradient_accumulation_steps {self.accumulation_steps} under the Megatron-LM layout: its "
                           "micro-batches are the accumulation", fix="use gradient_accumulation_steps 1 and "
                           "num_micro_batches for more")
        self.dp = world // (tp * stages)
        shard = plugin.use_distributed_optimizer
        self.sizes = {"pp": stages, "dp_replicate": 1 if shard else self.dp, "dp_shard": self.dp if shard else 1,
                      "tp": tp}
        self.device_mesh = init_device_mesh(state.device.type, tuple(self.sizes.values()),
                                            mesh_dim_names=tuple(self.sizes))
        self._dp_mesh = self.device_mesh["dp_replicate", "dp_shard"]._flatten("dp") if self.dp > 1 else None
        self.scheduled_backward = False
        state.main_is_last = True  # the script's is_main_process: the last rank, where the loss is (Accelerate's)
        self._new_params: dict[int, torch.nn.Parameter | None] = {}
        self._tie: TiedHead | None = None
        self._optimizers: list = []
        self.pipelines: list[pp.Pipeline] = []
        self.reordered = None  # (keys, parts) of weights the tensor cut holds in rank-major order (checkpoints)

    # --- the mesh's facts ---------------------------------------------------------------------------
    def rank_in(self, name: str) -> int:
        return self.device_mesh.get_local_rank(name)

    def data_parallel(self) -> tuple[int, int]:
        rank = self.rank_in("dp_replicate") * self.sizes["dp_shard"] + self.rank_in("dp_shard")
        return self.dp, rank

    def data_parallel_group(self):
        return self._dp_mesh.get_group() if self._dp_mesh is not None else None

    @property
    def last_stage(self) -> bool:
        return self.rank_in("pp") == self.sizes["pp"] - 1

    def loader_prepared(self, batch_size: int | None) -> None:
        if batch_size:
            self.plugin.micro_batch_size = batch_size // self.plugin.num_micro_batches
            self.plugin.global_batch_size = batch_size * self.dp

    # --- preparing ----------------------------------------------------------------------------------
    def prepare(self, models, optimizers, hints, settings: ModelSettings):
        wrapped = [self.wrap_model(m, settings) for m in models]
        for opt in optimizers:
            self._switch(opt)
            self._optimizers.append(opt)
        return wrapped, optimizers

    def wrap_model(self, model, settings: ModelSettings):
        if isinstance(model, MegatronModel):
            return model
        self.plugin.check_supported()
        stage, stages = self.rank_in("pp"), self.sizes["pp"]
        kind, tp = decoder_families.family(model), self.sizes["tp"]
        # every name of each parameter: a tied head's weight is the embeddings' under both names, and the last
        # stage keeps it as lm_head's alone
        names: dict[int, list[str]] = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(n)
        tied = decoder_families.tied(model)
        layer_class = type(decoder_families.blocks(model, kind)[0]).__name__

        def after_tensor_parallel(cut: torch.nn.Module) -> None:
            kind.fit_cut(cut, tp)
            if tied and stages == 1:  # the cut gave the head its own copy of the (equally cut) embedding weight
                cut.lm_head.weight = decoder_families.base(cut, kind).get_submodule(kind.embeddings[0]).weight

        self.reordered = kind.reordered() if tp > 1 else None
        schedule, virtual = self._schedule(len(decoder_families.blocks(model, kind)))
        settings = dataclasses.replace(
            settings, tp_plan=kind.tp_plan(bool(self.plugin.sequence_parallelism)),
            after_tensor_parallel=after_tensor_parallel,
            activation_checkpointing=bool(self.plugin.recompute_activations),
            checkpoint_layers=frozenset({layer_class}), split=lambda m: pp.trim(m, stage, stages, virtual))
        module = parallelize(model, _TensorMesh(self.device_mesh, self.sizes["tp"]), settings, place=self.place,
                             shard=self._shard if self.dp > 1 else None)
        if self.plugin.sequence_parallelism and self.sizes["tp"] > 1:
            module._hpc_sequence_factor = self.sizes["tp"]
        pipeline = None
        if stages > 1:
            pipeline = pp.Pipeline(module, self.device_mesh["pp"], self.state.device, self.plugin.num_micro_batches,
                                   schedule, virtual)
            self.pipelines.append(pipeline)
        now = {n.replace(_CHECKPOINT_PREFIX, ""): p for n, p in module.named_parameters()}
        for old_id, said in names.items():
            self._new_params[old_id] = next((now[n] for n in said if n in now), None)  # None: on another stage
        if tied and stages > 1:
            self._tie = TiedHead(module, kind, self.device_mesh, stage, stages)
        for opt in self._optimizers:
            self._switch(opt)
        return MegatronModel(module, self, pipeline)

    def _schedule(self, num_layers: int) -> tuple[str, int]:
        """The pipeline schedule and the virtual stages per rank: num_layers_per_virtual_pipeline_stage gives
        num_layers / (pp x it) of them and Megatron-LM's interleaved 1F1B unless another multi-stage schedule is
        named; a multi-stage schedule named alone runs 2 per rank."""
        stages, schedule = self.sizes["pp"], self.plugin.pipeline_schedule.lower()
        per = self.plugin.num_layers_per_virtual_pipeline_stage
        multi = pp.SCHEDULES.get(schedule, (None, False))[1]
        if stages == 1:
            return schedule, 1
        if not per:
            return schedule, 2 if multi else 1
        if num_layers % (stages * per):
            raise HpcError(f"num_layers_per_virtual_pipeline_stage {per} x pp_degree {stages} does not divide the "
                           f"model's {num_layers} blocks", fix=f"use a value that divides {num_layers // stages}")
        virtual = num_layers // (stages * per)
        if virtual > 1 and not multi:
            if schedule == "gpipe":
                raise HpcError("pipeline schedule gpipe runs one stage per rank: it does not take "
                               "num_layers_per_virtual_pipeline_stage", fix="use interleaved_1f1b or looped_bfs")
            schedule = "interleaved_1f1b"  # Megatron-LM's: virtual stages mean the interleaved schedule
        return schedule, virtual

    def place(self, model):
        return model.to(self.state.device)

    def _shard(self, model):
        """FSDP2 over the data-parallel ranks: each block, then the rest."""
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["dp_replicate", "dp_shard"]
        for layer in decoder_families.blocks(model).values():
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def _switch(self, optimizer) -> None:
        """The optimizer steps this rank's (cut, sharded) parameters; those of other stages leave it."""
        for group in optimizer.param_groups:
            params = [self._new_params.get(id(p), p) for p in group["params"]]
            group["params"] = [p for p in params if p is not None]

    def unwrap(self, model):
        return model.module if isinstance(model, MegatronModel) else model

    def next_token(self, module, ids: torch.Tensor) -> torch.Tensor:
        """The greedy next token of each sequence, run stage to stage (point to point over the pipeline's ranks;
        with virtual stages, round the ranks as many times)."""
        length = ids.shape[1]
        factor = module._hpc_sequence_factor
        padded = torch.nn.functional.pad(ids, (0, (-length) % factor))
        stages, stage = self.sizes["pp"], self.rank_in("pp")
        group = self.device_mesh["pp"].get_group() if stages > 1 else None
        chunks = len(module._hpc_chunks)
        hidden = None
        for chunk, at in enumerate(pp.rank_stages(stage, stages, chunks)):
            if at == 0:
                hidden = module(padded, chunk=chunk)
            else:
                size = module.config.hidden_size
                dtype = next(module.parameters()).dtype
                received = torch.empty(ids.shape[0], padded.shape[1] // factor, size, dtype=dtype,
                                       device=ids.device)
                dist.recv(received, group=group, group_src=(at - 1) % stages)
                hidden = module(received, chunk=chunk)
            if at < stages * chunks - 1:
                dist.send(hidden.contiguous(), group=group, group_dst=(at + 1) % stages)
        if stage == stages - 1:
            token = hidden[:, length - 1].argmax(-1, keepdim=True).to(ids.dtype)
        else:
            token = torch.zeros(ids.shape[0], 1, dtype=ids.dtype, device=ids.device)
        if stages > 1:
            dist.broadcast(token, group=group, group_src=stages - 1)
        return token

    # --- the step -----------------------------------------------------------------------------------
    def backward(self, loss, scaler, **kwargs) -> None:
        if self.scheduled_backward:  # the pipeline's schedule ran it, micro-batch by micro-batch
            self.scheduled_backward = False
            return
        super().backward(loss, scaler, **kwargs)

    def optimizer_step(self, optimizer, scaler, closure=None) -> bool:
        if self._tie is not None:
            self._tie.sum_gradients()
        clip = self.plugin.gradient_clipping
        if clip and clip > 0:
            self.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], clip)
        return super().optimizer_step(optimizer, scaler, closure)

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2.0):
        """The global gradient norm: each mesh's DTensors' norms, then summed over the pipeline's stages."""
        from torch.distributed.tensor import DTensor

        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        grads = [p.grad for p in parameters if p.grad is not None]
        # a tied head's copy on the last stage is the first stage's parameter: its norm is counted there, once
        copy = self._tie.copy if self._tie is not None else None
        counted = [p.grad for p in parameters if p.grad is not None and p is not copy]
        if norm_type == math.inf:
            raise HpcError("clip_grad_norm_(norm_type=inf) under the Megatron-LM layout", fix="use norm_type=2")
        total = torch.zeros((), device=self.state.device)
        by_mesh: dict = {}
        for g in counted:
            by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
        for group in by_mesh.values():
            norm = torch.nn.utils.get_total_norm(group, norm_type)
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            total = total + norm.float() ** norm_type
        if self.sizes["pp"] > 1:
            dist.all_reduce(total, group=self.device_mesh["pp"].get_group())
        total = total ** (1.0 / norm_type)
        coefficient = max_norm / (float(total) + 1e-6)
        if coefficient < 1.0:
            by_mesh = {}
            for g in grads:
                by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
            for group in by_mesh.values():
                torch._foreach_mul_(group, coefficient)
        return total

    # --- weights out --------------------------------------------------------------------------------
    def checkpoint_format(self):
        from hpc.runtime.checkpoint.formats import DcpFormat

        strategy = self

        class StageDcp(DcpFormat):  # the stage's own names (the whole model's), not the wrapper's
            def stage(self, models, optimizers, copy, background):
                # torch's background staging copies plain tensors and DTensors, not column_blocks' views
                background = background and strategy.reordered is None
                return super().stage([strategy.unwrap(m) for m in models], optimizers, copy, background)

            def load(self, folder, models, optimizers):
                return super().load(folder, [strategy.unwrap(m) for m in models], optimizers)

            def local_state(self, models, optimizers):  # the fast tier's: this rank's shards of its stage
                return super().local_state([strategy.unwrap(m) for m in models], optimizers)

            def load_local(self, folder, models, optimizers):
                return super().load_local(folder, [strategy.unwrap(m) for m in models], optimizers)

            def local_layout(self, models, optimizers):
                return super().local_layout([strategy.unwrap(m) for m in models], optimizers)

            def optimizer_options(self):
                # each parameter's group settings under its own name: a stage's groups hold only its parameters,
                # and a saved group (written by one rank) names only one stage's (torchtitan's choice too)
                from torch.distributed.checkpoint.state_dict import StateDictOptions

                return StateDictOptions(flatten_optimizer_state_dict=True)

            def shown(self, state):  # weights the cut holds in rank-major order, in the model's (column_blocks)
                if strategy.reordered is None:
                    return state
                from hpc.runtime.checkpoint import column_blocks

                pattern, parts = strategy.reordered
                return column_blocks.shown(state, pattern, strategy.sizes["tp"], parts)

            def restored(self, state):
                from hpc.runtime.checkpoint import column_blocks

                return column_blocks.restored(state)

            def whole_keys(self, model_state):  # every stage's keys
                if strategy.sizes["pp"] == 1:
                    return None
                keys: list = [None] * strategy.sizes["pp"]
                dist.all_gather_object(keys, sorted(model_state), group=strategy.device_mesh["pp"].get_group())
                return {k for part in keys for k in part}

        return StageDcp(self)

    def full_state_dict(self, model) -> dict:
        """The whole model's weights on the main process: every stage's tensors gathered (DTensors made whole),
        then sent to rank 0 over the pipeline's ranks."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # no cpu_offload: torch's then keeps the tensors on global rank 0 alone, and every stage needs its own
        mine = get_model_state_dict(self.unwrap(model), options=StateDictOptions(full_state_dict=True))
        mine = {k: v.detach().cpu() for k, v in mine.items()}
        if self.reordered is not None:  # the fused q/k/v in the model's own column order
            from hpc.runtime.parallel.conv1d_parallel import original_order

            pattern, parts = self.reordered
            mine = {k: original_order(v, self.sizes["tp"], parts) if pattern.search(k) else v
                    for k, v in mine.items()}
        # rank 0 (hpc's own writers) and the last rank (the script's main process) get the whole
        wanted = self.state.rank in (0, self.state.world_size - 1)
        if self.sizes["pp"] == 1:
            return mine if wanted else {}
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine if self.rank_in("tp") == 0 and self.data_parallel()[1] == 0 else {})
        if not wanted:
            return {}
        whole: dict = {}
        for part in parts:
            whole.update(part or {})
        return whole
