"""The rest of `accelerate.utils.operations`: a nest of tensors described without its data (to allocate the
receivers' side of a broadcast), fp32 outputs of a mixed-precision forward, padding a short final batch, and
ZeRO-3's gathered parameters."""

from __future__ import annotations

import contextlib
import functools
import pickle

import torch

from hpc.errors import HpcError
from hpc.runtime.process.nest import find_batch_size, is_torch_tensor, recursively_apply
from hpc.runtime.utilities.enums import TensorInformation


class CannotPadNestedTensorWarning(UserWarning):
    """pad_across_processes leaves a nested tensor as it is: its rows have no single size to pad to."""


def is_tensor_information(tensor_info) -> bool:
    return isinstance(tensor_info, TensorInformation)


def get_data_structure(data):
    """The same nest with each tensor replaced by its shape and dtype."""
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def initialize_tensors(data_structure):
    """Empty tensors of the shapes and dtypes get_data_structure recorded."""
    return recursively_apply(lambda info: torch.empty(*info.shape, dtype=info.dtype), data_structure,
                             test_type=is_tensor_information)


def ignorant_find_batch_size(data) -> int | None:
    """find_batch_size, or None where the data holds no tensor to read it from."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError, HpcError):  # hpc's find_batch_size says what it found in one line
        return None


def pad_input_tensors(tensor, batch_size: int, num_processes: int, dim: int = 0):
    """Zero rows appended so a final batch of ``batch_size`` splits over ``num_processes`` (Accelerate's
    arithmetic, which pipeline inference relies on to give every rank a slice)."""
    def pad(t, batch_size, num_processes, dim=0):
        per_rank = batch_size // num_processes
        leftover = batch_size - per_rank * num_processes
        to_pad = num_processes - batch_size if per_rank == 0 else num_processes - per_rank
        if leftover > to_pad & to_pad < 1:  # Accelerate's precedence, kept: same sizes as Accelerate
            to_pad = leftover - to_pad
        size = list(t.shape)
        size[0] = batch_size + to_pad
        out = t.new_zeros(tuple(size))
        out[tuple(slice(0, t.shape[dim]) if i == dim else slice(None) for i in range(len(size)))] = t
        return out

    return recursively_apply(pad, tensor, error_on_other_type=True, batch_size=batch_size,
                             num_processes=num_processes, dim=dim)


def convert_to_fp32(tensor):
    """Every fp16/bf16 tensor of the nest as float32; other leaves as they are."""
    def half(t):
        return (is_torch_tensor(t) or hasattr(t, "dtype")) and t.dtype in (torch.float16, torch.bfloat16)

    return recursively_apply(lambda t: t.float(), tensor, test_type=half)


class ConvertOutputsToFp32:
    """A forward whose outputs come back in float32. A prepared model carrying it does not pickle: unwrap it
    first (what Accelerate says too)."""

    def __init__(self, model_forward):
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args, **kwargs):
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self):
        raise pickle.PicklingError("Cannot pickle a prepared model with automatic mixed precision, please unwrap "
                                   "the model with `Accelerator.unwrap_model(model)` before pickling it.")


def convert_outputs_to_fp32(model_forward):
    converting = ConvertOutputsToFp32(model_forward)

    def forward(*args, **kwargs):
        return converting(*args, **kwargs)

    forward.__wrapped__ = converting  # extract_model_from_parallel(keep_fp32_wrapper=False) walks back through it
    return forward


@contextlib.contextmanager
def GatheredParameters(params, modifier_rank=None, fwd_module=None, enabled=True):  # noqa: N802 (Accelerate's name)
    """DeepSpeed's zero.GatheredParameters under ZeRO-3 (the sharded parameters whole inside the block); a no-op
    under every other strategy, where parameters are already whole on each rank."""
    from hpc.runtime.process.distributed_type import DistributedType
    from hpc.runtime.process.state import AcceleratorState, is_initialized

    zero3 = False
    if is_initialized() and AcceleratorState().distributed_type == DistributedType.DEEPSPEED:
        plugin = AcceleratorState().deepspeed_plugin
        zero3 = plugin is None or getattr(plugin, "zero_stage", None) == 3
    if not zero3:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank, fwd_module=fwd_module,
                                           enabled=enabled):
        yield
