"""How each strategy's model and optimizer state goes to disk and back.

full: one process holds everything (one process, DDP): rank 0 writes model_<i>.pt / optimizer_<i>.pt.
dcp: FSDP2 shards through torch.distributed.checkpoint: every rank writes its own shards, and the result
loads at another world size. deepspeed: the engine's own checkpoint (ZeRO partitions per rank).
Loading unpickles nothing (safe_load.py, dcp_safe.py) and says in one line when the model no longer fits (fit.py).

`stage()` runs on the training thread and returns a Staged save whose `write` may run on another thread:
given buffers, stage() copies what training will change next into them; `background` says the write
will run beside training.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hpc.runtime.checkpoint import fit, safe_load


def _nothing(*args) -> None:
    return None


@dataclass
class Staged:
    """A save in two halves: start (training thread, collective planning) and write (any thread)."""

    write: Callable  # (folder, files) -> None
    start: Callable = _nothing  # (folder) -> None
    background_ok: bool = True


class StagingBuffers:
    """Host copies for background saves, kept from one save to the next: a fresh allocation costs page
    faults on every byte, and GPU tensors copy several times faster into pinned memory."""

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}

    def copy(self, obj, key: str = "", later=None):
        """A snapshot that training cannot change: tensors copied to host memory, containers rebuilt.
        ``later(tensor, buffer) -> bool``: True where the copy into the buffer is left to the caller."""
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj.detach(), key, later)
        if isinstance(obj, dict):
            return {k: self.copy(v, f"{key}/{k}", later) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.copy(v, f"{key}/{i}", later) for i, v in enumerate(obj))
        return obj

    def _tensor(self, t: torch.Tensor, key: str, later=None) -> torch.Tensor:
        if t.layout != torch.strided or t.is_sparse or type(t) is not torch.Tensor:  # DTensors and the like
            return t.to("cpu", copy=True)
        buf = self._buffers.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
            self._buffers[key] = buf
        if later is not None and later(t, buf):
            return buf
        buf.copy_(t, non_blocking=t.is_cuda)
        return buf

    @staticmethod
    def synchronize() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the non-blocking copies above have landed


def _unwrapped(optimizer):
    """The torch optimizer inside hpc's wrapper. DCP gives a stateless optimizer (plain SGD) its state by calling
    step() with lr 0: through the wrapper that counted as a training step (completed_steps went up at every save)."""
    return getattr(optimizer, "optimizer", optimizer)


@contextlib.contextmanager
def _without_empty_groups(optimizer):
    """The optimizer with its groups that hold no parameter set aside while DCP sets its state: torch's flattened
    form fails on one (IndexError). Scripts make them (run_clm's no-decay group matches no name of a Llama), and a
    pipeline stage empties those whose parameters live on other stages. They hold no state; they come back in their
    places."""
    groups = optimizer.param_groups
    empty = [(i, g) for i, g in enumerate(groups) if not g["params"]]
    if not empty:
        yield
        return
    optimizer.param_groups = [g for g in groups if g["params"]]
    try:
        yield
    finally:
        kept = optimizer.param_groups
        for i, group in empty:
            kept.insert(i, group)
        optimizer.param_groups = kept


def _owner(optimizer, models):
    """The model whose parameters an optimizer steps (DCP needs the pair)."""
    params = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for model in models:
        if any(id(p) in params for p in model.parameters()):
            return model
    return models[0]


class FullFormat:
    name = "full"
    replicated = True  # every rank holds the whole state: rank 0 alone can save it, no rank waits for another

    def __init__(self, strategy):
        self.strategy = strategy

    def stage(self, models, optimizers, copy: StagingBuffers | None, background: bool) -> Staged:
        if self.strategy.state.env.rank != 0:
            return Staged(_nothing)
        state = {f"model_{i}.pt": self.strategy.unwrap(m).state_dict() for i, m in enumerate(models)}
        state.update({f"optimizer_{i}.pt": o.state_dict() for i, o in enumerate(optimizers)})
        if copy is not None:
            state = copy.copy(state, "full")

        def write(folder: Path, files) -> None:
            for name, obj in state.items():
                files.save(name, obj)

        return Staged(write)

    def load(self, folder: Path, models, optimizers) -> None:
        device = self.strategy.state.device
        read = _reader(device)
        states = [read(folder / f"model_{i}.pt") for i in range(len(models))]
        for i, (model, state) in enumerate(zip(models, states)):  # all checked before any is changed
            fit.check(folder, f"model {i}", state, self.strategy.unwrap(model).state_dict())
        for model, state in zip(models, states):
            self.strategy.unwrap(model).load_state_dict(state)
        for i, opt in enumerate(optimizers):
            opt.load_state_dict(read(folder / f"optimizer_{i}.pt"))


def _reader(device) -> Callable:
    """How a file of the state comes in: onto an accelerator through pinned buffers, the read overlapping the copy
    (device_load; torch.load copies each storage from pageable memory, synchronously), onto the host as torch
    reads it (measured on the CPU, torch.load is already at the disk's pace)."""
    if torch.device(device).type == "cpu":
        return lambda path: safe_load.load(path, map_location=device)
    from hpc.runtime.checkpoint import device_load

    return lambda path: device_load.load(path, device)


class DcpFormat:
    name = "dcp"
    folder = "dcp"

    def __init__(self, strategy):
        self.strategy = strategy
        self._async_group = None

    def _state(self, models, optimizers, options=None) -> dict:
        """``options``: the optimizer state's form (None: this layout's own, optimizer_options)."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        state = {f"model_{i}": get_model_state_dict(m) for i, m in enumerate(models)}
        for i, opt in enumerate(optimizers):
            opt = _unwrapped(opt)
            state[f"optimizer_{i}"] = get_optimizer_state_dict(_owner(opt, models), opt,
                                                               options=options or self.optimizer_options())
        return state

    def _saved_options(self, saved: dict):
        """The optimizer state's form in a checkpoint's metadata: flattened (Megatron's layouts keep each
        parameter's group settings under its own name: ``optimizer_0.param_groups.<name>.lr``) or torch's default
        (``optimizer_0.param_groups.0.lr``). It is read back in that form, whichever layout loads it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        groups = [k.split(".", 3)[2] for k in saved if k.startswith("optimizer_") and ".param_groups." in k]
        mine = self.optimizer_options()
        if not groups:
            return mine
        flat = not all(g.isdigit() for g in groups)
        if bool(getattr(mine, "flatten_optimizer_state_dict", False)) == flat:
            return mine
        return StateDictOptions(flatten_optimizer_state_dict=flat)

    def stage(self, models, optimizers, copy: StagingBuffers | None, background: bool) -> Staged:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        state = self.shown(self._state(models, optimizers))
        rank = self.strategy.state.env.rank
        if background:
            # a group of its own: the writer's collectives run beside training's and must not interleave
            if self._async_group is None:
                self._async_group = dist.new_group(backend="gloo")
            future_holder: list = []

            def write(folder: Path, files) -> None:
                future_holder[0].result()
                files.claim(f"{self.folder}/__{rank}_*")

            def start(folder: Path) -> None:
                future_holder.append(dcp.async_save(state, checkpoint_id=str(folder / self.folder),
                                                    process_group=self._async_group))

            return Staged(write, start)  # planned collectively now, written in the background

        def write_sync(folder: Path, files) -> None:
            dcp.save(state, checkpoint_id=str(folder / self.folder))
            files.claim(f"{self.folder}/__{rank}_*")

        return Staged(write_sync, background_ok=False)

    def optimizer_options(self):
        """torch's StateDictOptions for the optimizers' state (None: its defaults)."""
        return None

    def shown(self, state: dict) -> dict:
        """The state as the shared checkpoint holds it (a layout may hold some weights in another order)."""
        return state

    def restored(self, state: dict) -> dict:
        """shown()'s inverse, after a load."""
        return state

    def local_state(self, models, optimizers) -> dict:
        """This rank's shards as files of plain tensors (the fast tier's folder; local_shards.py)."""
        from hpc.runtime.checkpoint import local_shards

        return local_shards.state(self, models, optimizers)

    def local_layout(self, models, optimizers) -> str:
        from hpc.runtime.checkpoint import local_shards

        return local_shards.layout(models)

    def load_local(self, folder: Path, models, optimizers) -> None:
        from hpc.runtime.checkpoint import local_shards

        self._set(local_shards.read(self, folder, models, optimizers, self.strategy.state.device), models, optimizers)

    def _set(self, state: dict, models, optimizers, options=None) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        for i, model in enumerate(models):
            set_model_state_dict(model, state[f"model_{i}"])
        for i, opt in enumerate(optimizers):
            opt = _unwrapped(opt)
            with _without_empty_groups(opt):
                set_optimizer_state_dict(_owner(opt, models), opt, state[f"optimizer_{i}"],
                                         options=options or self.optimizer_options())

    def whole_keys(self, model_state: dict) -> set | None:
        """The whole model's keys where this rank holds a part (a pipeline stage); None: this rank's are all."""
        return None

    def load(self, folder: Path, models, optimizers) -> None:
        import torch.distributed.checkpoint as dcp

        from hpc.runtime.checkpoint import dcp_safe

        saved = dcp_safe.read_metadata(folder / self.folder).state_dict_metadata
        options = self._saved_options(saved)
        state = self._state(models, optimizers, options)
        for i in range(len(models)):
            prefix = f"model_{i}."
            shapes = {k[len(prefix):]: _Shape(tuple(v.size)) if hasattr(v, "size") else None
                      for k, v in saved.items() if k.startswith(prefix)}
            fit.check(folder, f"model {i}", shapes, state[f"model_{i}"], self.whole_keys(state[f"model_{i}"]))
        planner = dcp_safe.SafeLoadPlanner()
        shown = self.shown(state)
        dcp_safe.loading(folder / self.folder, lambda: dcp.load(
            shown, storage_reader=dcp_safe.SafeReader(str(folder / self.folder)), planner=planner), planner)
        self._set(self.restored(shown), models, optimizers, options)


class DeepSpeedFormat:
    """The engine writes and reads its own partitions (collectively); always synchronous."""

    name = "deepspeed"
    folder, tag = "deepspeed", "state"
    # why it loads at its own world size only (None: any): DeepSpeed 0.19's engine refuses a ZeRO checkpoint of
    # another data-parallel size (its elastic_checkpoint too) with a traceback; hpc says so before it starts
    fixed_world = "DeepSpeed's ZeRO checkpoints hold one optimizer partition per rank and do not reshard"

    def __init__(self, strategy):
        self.strategy = strategy

    def stage(self, models, optimizers, copy: StagingBuffers | None, background: bool) -> Staged:
        def write(folder: Path, files) -> None:
            self.strategy.engine.save_checkpoint(str(folder / self.folder), tag=self.tag, save_latest=False)
            files.claim(f"{self.folder}/{self.tag}/*zero_pp_rank_{self.strategy.state.env.rank}_*")

        return Staged(write, background_ok=False)

    # --- the fast tier's (tiers/fast_tier.py): each rank's own files in its node-memory folder ---------------
    def local_state(self, models, optimizers) -> dict:
        return {}  # the engine writes this rank's state itself (write_local): nothing for the tier to pickle

    def write_local(self, folder: Path) -> None:
        """On the training thread, every rank at once (the engine's save is collective): this rank's ZeRO
        partition and the module's state (DeepSpeed writes the latter on the first data-parallel rank only; here on
        every rank, so that each rank's folder resumes alone, on whichever node holds it) into ``folder``."""
        engine = self.strategy.engine
        (folder / self.folder).mkdir(parents=True, exist_ok=True)  # the engine makes it on rank 0 only
        writes_module = engine.save_non_zero_checkpoint
        engine.save_non_zero_checkpoint = True
        try:
            engine.save_checkpoint(str(folder / self.folder), tag=self.tag, save_latest=False)
        finally:
            engine.save_non_zero_checkpoint = writes_module

    local_files = f"{folder}/{tag}/*"  # what write_local leaves, claimed by the fast tier's manifest

    def local_bytes(self) -> int:
        """About what write_local writes, before it does (the tier's room check): the module's weights, and this
        rank's partition of the fp32 weights and two Adam moments."""
        # ZeRO-3 leaves each parameter empty: its ds_numel is the whole
        params = self.strategy.engine.module.parameters()
        sizes = [(getattr(p, "ds_numel", p.numel()), p.element_size()) for p in params]
        weights = sum(n * size for n, size in sizes)
        return weights + 12 * sum(n for n, _ in sizes) // max(self.strategy.engine.dp_world_size, 1)

    def local_layout(self, models, optimizers) -> str:
        """The ZeRO stage, the data-parallel size and every parameter's name and shape: what a rank's partition
        fits (another layout reads the shared tier)."""
        import hashlib

        engine = self.strategy.engine
        parts = [f"zero{engine.zero_optimization_stage()}:dp{engine.dp_world_size}"]
        parts += [f"{name}:{tuple(getattr(p, 'ds_shape', p.shape))}:{p.dtype}"
                  for name, p in engine.module.named_parameters()]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

    def load_local(self, folder: Path, models, optimizers) -> None:
        self.load(folder, models, optimizers)

    def load(self, folder: Path, models, optimizers) -> None:
        engine = self.strategy.engine
        own = engine.checkpoint_engine
        engine.checkpoint_engine = _SafeDeepSpeedFiles(own)
        try:
            path, _ = engine.load_checkpoint(str(folder / self.folder), tag=self.tag, load_optimizer_states=True,
                                             load_lr_scheduler_states=False)
        finally:
            engine.checkpoint_engine = own
        if path is None:
            raise FileNotFoundError(f"{folder / self.folder}: DeepSpeed found no checkpoint there")


@dataclass(frozen=True)
class _Shape:
    """A saved tensor's shape, standing for the tensor where only the metadata was read."""

    shape: tuple


class _SafeDeepSpeedFiles:
    """DeepSpeed's checkpoint engine, reading with weights_only=True: its files hold tensors, plain data and a
    few of DeepSpeed's own plain-data classes (the loss scaler's settings, the ZeRO stage, a fragment's
    address), allowed by name and nothing else."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def load(self, path, map_location=None):
        return safe_load.load(path, map_location=map_location, allow=_deepspeed_globals())


def _deepspeed_globals() -> list:
    from deepspeed.runtime.fp16 import loss_scaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [loss_scaler.LossScaler, loss_scaler.DynamicLossScaler, ZeroStageEnum, fragment_address]
