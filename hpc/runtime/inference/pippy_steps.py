"""The steps of Accelerate's prepare_pippy as functions of their own (accelerate.inference exports them):
generate_device_map, find_pippy_batch_size, build_pipeline, pippy_forward. hpc's prepare_pippy (pipeline.py) does
more than chaining them (it checks the model traces, pads short batches and cuts the output back, keeps the model's
output type); these are for scripts that call a step directly."""

from __future__ import annotations

import math

from hpc.runtime.process.nest import walk
from hpc.runtime.process.state import PartialState


def generate_device_map(model, num_processes: int = 1, no_split_module_classes=None, max_memory: dict | None = None):
    """``{module name: stage index}``: the model in ``num_processes`` parts of about equal bytes (each part 10% over
    its share, so a part is never left empty by a rounding), whole classes of ``no_split_module_classes`` kept."""
    from hpc.runtime.big_models.device_map import infer_auto_device_map
    from hpc.runtime.big_models.sizes import calculate_maximum_sizes

    if num_processes == 1:
        return infer_auto_device_map(model, no_split_module_classes=no_split_module_classes, clean_result=False)
    if max_memory is None:
        model_size, shared = calculate_maximum_sizes(model)
        share = math.ceil((model_size + shared[0]) / num_processes * 1.1)
        max_memory = {index: share for index in range(num_processes)}
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                 clean_result=False)


def _batch_size(data) -> int | None:
    found = []
    walk(lambda t: found.append(t.shape[0]) if t.dim() > 0 else None, data)
    return found[0] if found else None


def find_pippy_batch_size(args, kwargs) -> int | None:
    """dim 0 of the first tensor with one in ``args``, then in ``kwargs``' values; None if there is none."""
    for part in list(args or ()) + list((kwargs or {}).values()):
        found = _batch_size(part)
        if found is not None:
            return found
    return None


def build_pipeline(model, split_points, args, kwargs, num_chunks):
    """torch.distributed.pipelining's GPipe schedule over this rank's stage of ``model`` cut before each split
    point, traced on one microbatch (``args``/``kwargs``)."""
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    state = PartialState()
    pipe = pipeline(model, mb_args=tuple(args), mb_kwargs=kwargs,
                    split_spec={point: SplitPoint.BEGINNING for point in split_points})
    return ScheduleGPipe(pipe.build_stage(state.local_process_index, device=state.device), num_chunks)


def _pad_rows(data, rows: int, to: int):
    def pad(tensor):
        if tensor.dim() == 0 or tensor.shape[0] != rows or rows == to:
            return tensor
        padded = tensor.new_zeros((to, *tensor.shape[1:]))
        padded[:rows] = tensor
        return padded

    return walk(pad, data)


def pippy_forward(forward, num_chunks: int, gather_output: bool, *args, **kwargs):
    """One call of a pipeline's ``forward`` (a schedule's step) on this rank: the first rank feeds the inputs (its
    batch padded with zero rows to a multiple of ``num_chunks``), the last gets the output, the ones between only
    pass activations on. The output is on the last rank, or on every rank with ``gather_output``; else None."""
    state = PartialState()
    output = None
    if state.num_processes == 1:
        output = forward(*args, **kwargs)
    elif state.is_local_main_process:
        rows = find_pippy_batch_size(args, kwargs)
        if rows is None:
            raise ValueError("Could not find batch size from args or kwargs")
        to = math.ceil(rows / num_chunks) * num_chunks
        forward(*_pad_rows(args, rows, to), **_pad_rows(kwargs, rows, to))
    elif state.is_last_process:
        output = forward()
    else:
        forward()
    if gather_output and state.num_processes > 1:
        from hpc.runtime.process.collectives import copy_tensor_to_devices

        output = copy_tensor_to_devices(output if state.is_last_process else None)
    return output


__all__ = ["build_pipeline", "find_pippy_batch_size", "generate_device_map", "pippy_forward"]
