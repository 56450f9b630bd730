"""The Accelerator's collectives (gather, gather_for_metrics, reduce, check_trigger, wait_for_everyone): each enters
the run guard first (resume, stop vote, hang watch: ``before_collective``, handed in), then runs the one
implementation in collectives.py over this process's ranks."""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from hpc.runtime.process import collectives, nest
from hpc.runtime.process.gradient_state import GradientState
from hpc.runtime.process.nest import all_tensors
from hpc.runtime.process.process_state import ProcessState


class RunCollectives:
    def __init__(self, process: ProcessState, gradient_state: GradientState, before_collective: Callable[[str], None],
                 debug: Callable[[], bool]):
        self._process, self._gradient_state, self._before = process, gradient_state, before_collective
        self._debug = debug  # the Accelerator's debug attribute, read at each call: a script may set it
        self._trigger = False  # set_trigger / check_trigger

    def gather(self, data):
        self._before("gather")
        if self._debug():
            collectives.verify_shapes(data, self._process.world_size, "gather")
        return collectives.gather_across(data, self._process.world_size)

    def gather_for_metrics(self, data, use_gather_object: bool = False):
        """gather(), minus the samples the last batch repeated to keep ranks even. Objects that are not tensors
        (strings, lists of dicts), or use_gather_object=True, are gathered by pickling into one flat list."""
        if use_gather_object or not all_tensors(data):
            self._before("gather_object")
            items = data if isinstance(data, (list, tuple)) else [data]
            world = self._process.world_size
            gathered = [item for part in collectives.gather_object_across(items, world) for item in part]
        else:
            gathered = self.gather(data)
        if self._gradient_state.remainder >= 0:
            gathered = (gathered[: self._gradient_state.remainder] if isinstance(gathered, list)
                        else nest.truncate(gathered, self._gradient_state.remainder))
        return gathered

    def set_trigger(self) -> None:
        """Raise a flag on this rank (a loss gone NaN, say) that check_trigger() then sees on every rank."""
        self._trigger = True

    def check_trigger(self) -> bool:
        """True on every rank if any rank called set_trigger() since the last check; resets it. Every rank
        must call it (one small all-reduce)."""
        flag = torch.tensor([1.0 if self._trigger else 0.0], device=self._process.device)
        if self._process.distributed:
            self._before("check_trigger")
            dist.all_reduce(flag)
        raised = bool(flag.item() > 0)
        if raised:
            self._trigger = False
        return raised

    def reduce(self, tensor, reduction: str = "sum", scale: float = 1.0):
        """Every tensor of the nest reduced over the ranks: summed by default, as Accelerate's Accelerator does
        (its hpc.utils.reduce means by default). ``scale`` applies on TPUs only in Accelerate: here it is
        accepted and, as there on CPUs and GPUs, not applied."""
        self._before("reduce")
        if self._debug():
            collectives.verify_shapes(tensor, self._process.world_size, "reduce")
        return collectives.reduce_across(tensor, self._process.world_size, reduction)

    def pad_across_processes(self, data, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
        return collectives.pad_across(data, self._process.world_size, dim, pad_index, pad_first)

    def wait_for_everyone(self) -> None:
        self._before("wait_for_everyone")  # every rank is here: e.g. resume before a final save
        self._process.barrier()
