"""`accelerate.state`: PartialState (this process's place in the job, no Accelerator needed) and AcceleratorState.

Every PartialState() of a process shares one state, as Accelerate's does; the first one forms the process group
when the job has several ranks (ProcessState.start, as the Accelerator does), so a script can use the free
collectives of hpc.utils before, without or beside an Accelerator. An Accelerator that registers itself
(attach_accelerator) lends its process state, its strategy (distributed_type) and its precision.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist

from hpc.errors import HpcError
from hpc.runtime.precision import normalize
from hpc.runtime.process import excepthook, stop_vote
from hpc.runtime.process.distributed_type import DistributedType
from hpc.runtime.process.process_state import ProcessState
from hpc.runtime.settings import job_setting

__all__ = ["AcceleratorState", "DistributedType", "PartialState", "attach_accelerator", "distributed_type_of",
           "is_initialized", "wait_for_everyone"]


def _no_accelerator():
    return None


_accelerator: Callable[[], Any] = _no_accelerator  # a weak reference: the state must not keep a finished run alive


def attach_accelerator(accelerator) -> None:
    """Called by the Accelerator once built: PartialState and AcceleratorState then report its facts."""
    global _accelerator
    _accelerator = weakref.ref(accelerator)
    PartialState._shared_state.setdefault("process", accelerator._process)


_reset_accelerators: "weakref.WeakSet" = weakref.WeakSet()  # detached by AcceleratorState._reset_state()


def check_not_reset(accelerator) -> None:
    """An Accelerator whose state was reset (AcceleratorState._reset_state()) must not go on silently."""
    if accelerator in _reset_accelerators:
        raise AttributeError("`AcceleratorState` object has no attribute `distributed_type`. This happens if "
                             "`AcceleratorState._reset_state()` was called and an `Accelerator` or `PartialState` "
                             "was not reinitialized.")


def is_initialized() -> bool:
    """Whether an Accelerator has registered (Accelerate: whether AcceleratorState was set up by one)."""
    return _accelerator() is not None


_STRATEGY_TYPES = {"single": DistributedType.NO, "fsdp": DistributedType.FSDP, "deepspeed": DistributedType.DEEPSPEED,
                   "megatron": DistributedType.MEGATRON_LM}


def distributed_type_of(kind, device: torch.device, world: int) -> DistributedType:
    """hpc's strategy name (Accelerator.strategy.name; None without an Accelerator) as Accelerate's DistributedType,
    unless a script set one (AcceleratorState().distributed_type = ...). Plain data parallelism (and a bare process
    group) is MULTI_GPU or MULTI_CPU by the device, as in Accelerate."""
    if "distributed_type" in PartialState._shared_state:
        return PartialState._shared_state["distributed_type"]
    if isinstance(kind, DistributedType):
        return kind
    if kind in _STRATEGY_TYPES:
        return _STRATEGY_TYPES[kind]
    if world <= 1:
        return DistributedType.NO
    return DistributedType.MULTI_GPU if device.type == "cuda" else DistributedType.MULTI_CPU


def _start(cpu: bool, kwargs: dict) -> ProcessState:
    unknown = sorted(set(kwargs) - {"backend"})
    if unknown:
        raise HpcError(f"PartialState({unknown[0]}=...) is not supported by hpc",
                       fix="drop it: hpc forms the process group itself (env:// rendezvous, gloo on CPU, nccl on GPUs)")
    cpu = bool(cpu or job_setting("use_cpu"))
    if dist.is_available() and dist.is_initialized() and "nccl" not in dist.get_backend():
        cpu = True  # a group someone else formed without NCCL carries CPU tensors only
    expected = "gloo" if cpu or not torch.cuda.is_available() else "nccl"
    if kwargs.get("backend") not in (None, expected):
        raise HpcError(f"PartialState(backend={kwargs['backend']!r}): this process uses {expected}",
                       fix="drop backend (hpc picks nccl with GPUs, gloo without or with cpu=True)")
    return ProcessState.start(cpu=cpu)


def _do_nothing(*args, **kwargs):
    return None


class PartialState:
    """This process's rank, device and process group, shared by every instance (Accelerate's Borg singleton)."""

    _shared_state: dict = {}

    def __init__(self, cpu: bool = False, **kwargs):
        self.__dict__ = self._shared_state
        if "process" not in self._shared_state:
            excepthook.install()  # from here this is a job's process: a refused setting is one line per rank
            self._shared_state["process"] = _start(cpu, kwargs)
            return
        if cpu and self.device.type != "cpu":
            raise HpcError(f"PartialState(cpu=True) after this process's state started on {self.device}",
                           fix="pass cpu=True to the script's first PartialState() or Accelerator()")
        if kwargs:
            raise HpcError(f"PartialState({sorted(kwargs)[0]}=...) after this process's state started",
                           fix="give process group settings to the first PartialState() only, or drop them")

    # every instance is a view of one shared state: equal when the states are (an unpickled copy included)
    def __eq__(self, other) -> bool:
        return isinstance(other, PartialState) and self.__dict__ == other.__dict__

    __hash__ = object.__hash__

    @staticmethod
    def _reset_state() -> None:
        """Forget the shared state (tests); the process group, if any, stays."""
        PartialState._shared_state.clear()

    @property
    def _process(self) -> ProcessState:
        return self._shared_state["process"]

    @property
    def initialized(self) -> bool:
        return "process" in self._shared_state

    @property
    def num_processes(self) -> int:
        return self._process.world_size

    @property
    def process_index(self) -> int:
        return self._process.rank

    @property
    def local_process_index(self) -> int:
        return self._process.local_rank

    @property
    def device(self) -> torch.device:
        return self._process.device

    @property
    def backend(self) -> str | None:
        if dist.is_available() and dist.is_initialized():
            return dist.get_backend()
        return self._process.backend

    @property
    def distributed_type(self) -> DistributedType:
        accelerator = _accelerator()
        kind = accelerator.distributed_type if accelerator is not None else None
        return distributed_type_of(kind, self.device, self.num_processes)

    @property
    def use_distributed(self) -> bool:
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self._process.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self._process.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self._process.is_last_process

    @property
    def debug(self) -> bool:
        """Collectives first compare every rank's shapes (set here, else ACCELERATE_DEBUG_MODE or the Accelerator's
        debug)."""
        if "debug" in self._shared_state:
            return self._shared_state["debug"]
        accelerator = _accelerator()
        if accelerator is not None:
            return bool(accelerator.debug)
        return bool(job_setting("debug"))

    @debug.setter
    def debug(self, value: bool) -> None:
        self._shared_state["debug"] = bool(value)

    def __repr__(self) -> str:
        backend = f"  Backend: {self.backend}" if self.backend else ""
        return (f"Distributed environment: {self.distributed_type.value}{backend}\n"
                f"Num processes: {self.num_processes}\nProcess index: {self.process_index}\n"
                f"Local process index: {self.local_process_index}\nDevice: {self.device}\n")

    # --- waiting and taking turns -----------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        if self.use_distributed:
            dist.barrier()

    def _goes_first(self, first: bool):
        if not first:
            self.wait_for_everyone()
        yield
        if first:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def main_process_first(self):
        """The main process runs the block (a download, a cache) before the others enter it."""
        yield from self._goes_first(self.is_main_process)

    @contextlib.contextmanager
    def local_main_process_first(self):
        yield from self._goes_first(self.is_local_main_process)

    @contextlib.contextmanager
    def split_between_processes(self, inputs, apply_padding: bool = False):
        """This rank's contiguous share of a list, tuple, tensor (along dim 0), dict of those, or datasets.Dataset.

        The first ``len % world`` ranks hold one item more; with ``apply_padding`` the others repeat the input's
        last item to hold as many (so gather() works), which the caller drops again afterwards."""
        world, rank = self.num_processes, self.process_index
        if world == 1:
            yield inputs
            return
        if isinstance(inputs, dict):
            lengths = {key: _length(value) for key, value in inputs.items()}
            if len(set(lengths.values())) > 1:
                listed = ", ".join(f"{k!r}: {n}" for k, n in lengths.items())
                raise HpcError(f"split_between_processes: the dict's values differ in length ({listed})",
                               fix="give every key as many items")
            n = next(iter(lengths.values()), 0)
        else:
            n = _length(inputs)
        if apply_padding and n == 0:
            raise HpcError("split_between_processes(apply_padding=True) got no items to repeat",
                           fix="pass at least one item, or apply_padding=False")
        per, extra = divmod(n, world)
        start = rank * per + min(rank, extra)
        end = start + per + (1 if rank < extra else 0)
        missing = (per + (1 if extra else 0)) - (end - start) if apply_padding else 0

        def share(x):
            if isinstance(x, torch.Tensor):
                return torch.cat([x[start:end]] + [x[-1:]] * missing)
            if isinstance(x, (list, tuple)):
                return x[start:end] + type(x)([x[-1]]) * missing
            return x.select(list(range(start, end)) + [n - 1] * missing)  # a datasets.Dataset

        yield {key: share(value) for key, value in inputs.items()} if isinstance(inputs, dict) else share(inputs)

    # --- running on some ranks only ---------------------------------------------------------------
    # Decided when the function is decorated, as in Accelerate: the other ranks get a function returning None.
    def _only_if(self, runs: bool, function):
        return function if runs or not self.use_distributed else _do_nothing

    def on_main_process(self, function: Callable | None = None):
        if function is None:
            return self.on_main_process
        return self._only_if(self.is_main_process, function)

    def on_local_main_process(self, function: Callable | None = None):
        if function is None:
            return self.on_local_main_process
        return self._only_if(self.is_local_main_process, function)

    def on_last_process(self, function: Callable):
        return self._only_if(self.is_last_process, function)

    def on_process(self, function: Callable | None = None, process_index: int | None = None):
        if process_index is None:
            raise HpcError("on_process needs process_index", fix="decorate with @state.on_process(process_index=1)")
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only_if(self.process_index == process_index, function)

    def on_local_process(self, function: Callable | None = None, local_process_index: int | None = None):
        if local_process_index is None:
            raise HpcError("on_local_process needs local_process_index",
                           fix="decorate with @state.on_local_process(local_process_index=1)")
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._only_if(self.local_process_index == local_process_index, function)

    def print(self, *args, **kwargs) -> None:
        """print() on the local main process only (one copy per node), as Accelerate's."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group=None) -> None:
        if dist.is_available() and dist.is_initialized():
            stop_vote.finish_all()  # stop votes still travelling need the group
            dist.destroy_process_group(group)


def _length(x) -> int:
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            raise HpcError("split_between_processes cannot split a 0-d tensor", fix="pass a tensor with a batch dim")
        return x.shape[0]
    if isinstance(x, (list, tuple)) or hasattr(x, "select"):
        return len(x)
    raise HpcError(f"split_between_processes cannot split a {type(x).__name__}",
                   fix="pass a list, tuple, tensor, datasets.Dataset or a dict of them")


class AcceleratorState:
    """PartialState's facts plus the Accelerator's choices (mixed precision, the strategy's plugin).

    Not a singleton of its own: it reads the registered Accelerator, or, before one exists, what one built now would
    choose from the job's settings (where Accelerate raises until an Accelerator exists)."""

    def __init__(self, mixed_precision: str | None = None, cpu: bool = False, **kwargs):
        self._partial = PartialState(cpu, **kwargs)
        self._mixed_precision = mixed_precision
        if mixed_precision is not None and self.initialized:
            if normalize(mixed_precision) != self.mixed_precision:
                raise HpcError(f"AcceleratorState(mixed_precision={mixed_precision!r}) differs from the Accelerator's "
                               f"{self.mixed_precision!r}", fix="pass mixed_precision to Accelerator() only")

    def __getattr__(self, name: str):
        if name == "_partial":  # not yet set (unpickling, a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self._partial, name)

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the registered Accelerator (it refuses further prepare() calls) and, if asked, the process
        state; the process group stays. The next Accelerator() registers afresh."""
        global _accelerator
        accelerator = _accelerator()
        if accelerator is not None:
            _reset_accelerators.add(accelerator)
        _accelerator = _no_accelerator
        PartialState._shared_state.pop("distributed_type", None)
        if reset_partial_state:
            PartialState._reset_state()

    @property
    def distributed_type(self) -> DistributedType:
        return self._partial.distributed_type

    @distributed_type.setter
    def distributed_type(self, value: DistributedType) -> None:
        PartialState._shared_state["distributed_type"] = DistributedType(value)

    @property
    def initialized(self) -> bool:
        return is_initialized()

    @property
    def mixed_precision(self) -> str:
        accelerator = _accelerator()
        if accelerator is not None:
            return accelerator.mixed_precision
        return normalize(self._mixed_precision or job_setting("mixed_precision"))

    def _plugin(self, kind: DistributedType):
        accelerator = _accelerator()
        if accelerator is None or self.distributed_type != kind:
            return None
        return accelerator.strategy.plugin

    @property
    def deepspeed_plugin(self):
        return self._plugin(DistributedType.DEEPSPEED)

    @property
    def fsdp_plugin(self):
        return self._plugin(DistributedType.FSDP)

    @property
    def megatron_lm_plugin(self):
        return self._plugin(DistributedType.MEGATRON_LM)

    @property
    def strategy(self):
        """The running Accelerator's strategy (None without one): Megatron's helpers find their groups there."""
        accelerator = _accelerator()
        return accelerator.strategy if accelerator is not None else None

    def __repr__(self) -> str:
        return repr(self._partial) + f"\nMixed precision type: {self.mixed_precision}\n"


def wait_for_everyone() -> None:
    """accelerate.utils.wait_for_everyone: a barrier over every rank (nothing with one process)."""
    PartialState().wait_for_everyone()


