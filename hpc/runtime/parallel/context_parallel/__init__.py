"""Context parallelism: every sequence split over the "cp" ranks of the mesh, attention computed across them.

`Accelerator.maybe_context_parallel(buffers, buffer_seq_dims, no_restore_buffers)` (Accelerate's) opens one step's
split: the buffers (input_ids, labels, shift_labels, position_ids...) become this rank's part of themselves, in
place, and scaled_dot_product_attention attends across the ranks while it is open. On CUDA that is torch's ring
attention (torch.distributed.tensor.experimental.context_parallel); elsewhere hpc's gathered attention, which
torch 2.13 lacks for the CPU kernel (gathered_attention.py). FSDP shards over dp_shard x cp (the "dp_shard_cp"
mesh), so the cp ranks' gradients of the same batch are averaged as a data-parallel dimension's are.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from hpc.errors import HpcError
from hpc.runtime.parallel.context_parallel import gathered_attention, model_hooks, sequence_shards


class ContextParallel:
    def __init__(self, parallelism, device_type: str):
        self.mesh = parallelism.submesh("cp")
        self.size, self.rank = self.mesh.size(), self.mesh.get_local_rank()
        self.comm_strategy = parallelism.cp_handler.cp_comm_strategy
        self.ring = device_type == "cuda"  # torch's ring kernels are CUDA's SDPA kernels
        self.forwards = model_hooks.Forwards()
        self.open = False
        self._backed = False  # a backward ran inside the split now open
        self._unbacked = False  # a split closed after a forward with no backward inside it

    def prepare_model(self, model: torch.nn.Module) -> None:
        model_hooks.check(model)
        model_hooks.attach(model, self.forwards)

    @contextlib.contextmanager
    def split(self, buffers, buffer_seq_dims, no_restore_buffers):
        buffers, dims, keep = _checked(buffers, buffer_seq_dims, no_restore_buffers)
        length = buffers[0].shape[dims[0]]
        opened = self._torch_ring(buffers, dims, keep, length) if self.ring else self._gathered(buffers, dims, keep,
                                                                                                   length)
        self.forwards.forwards = self.forwards.attention_calls = 0
        self._backed = False
        with opened as positions, self._counting():
            self.forwards.positions, self.open = positions, True
            try:
                yield
            finally:
                self.forwards.positions, self.open = None, False
        self._unbacked = bool(self.forwards.forwards) and not self._backed
        if self.forwards.forwards and not self.forwards.attention_calls:
            raise HpcError("context parallelism: the model ran inside maybe_context_parallel without calling "
                           "scaled_dot_product_attention, so it attended within this rank's part of the sequence only",
                           fix="use a model whose attention calls torch.nn.functional.scaled_dot_product_attention "
                               "(attn_implementation='sdpa')")

    def before_backward(self) -> None:
        """Backward belongs inside the split: its end gives the buffers back (the graph saved their shards), and
        torch's ring attention runs its backward only while the split is open."""
        if self.open:
            self._backed = True
        elif self._unbacked:
            self._unbacked = False
            raise HpcError("context parallelism: backward() after the maybe_context_parallel block that ran the "
                           "forward had closed", fix="call accelerator.backward(loss) inside the with block, as "
                           "Accelerate's example does")

    @contextlib.contextmanager
    def _gathered(self, buffers, dims, keep, length):
        device = buffers[0].device
        mine = sequence_shards.positions(length, self.size, self.rank, device)
        everyone = sequence_shards.every_rank(length, self.size, device)
        originals = [None if b in keep else b.clone() for b in buffers]
        for buffer, dim in zip(buffers, dims):
            sequence_shards.shard_in_place(buffer, dim, mine)
        sdpa = F.scaled_dot_product_attention

        def split_attention(*args, **kwargs):
            return gathered_attention.attention(*args, **kwargs, sdpa=sdpa, group=self.mesh.get_group(), mine=mine,
                                                everyone=everyone)

        F.scaled_dot_product_attention = split_attention
        try:
            yield mine
        finally:
            F.scaled_dot_product_attention = sdpa
            for buffer, original in zip(buffers, originals):
                if original is not None:
                    sequence_shards.restore_in_place(buffer, original)

    @contextlib.contextmanager
    def _torch_ring(self, buffers, dims, keep, length):
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        sequence_shards.positions(length, self.size, self.rank)  # the same divisibility, said hpc's way
        sequence_shards.make_private(buffers)
        set_rotate_method(self.comm_strategy)
        index = torch.arange(length, device=buffers[0].device)  # split beside them: its shard is the positions
        with context_parallel(self.mesh, buffers=[*buffers, index], buffer_seq_dims=[*dims, 0],
                              no_restore_buffers={*keep, index}):
            yield index

    @contextlib.contextmanager
    def _counting(self):
        inner = F.scaled_dot_product_attention

        def counted(*args, **kwargs):
            self.forwards.attention_calls += 1
            return inner(*args, **kwargs)

        F.scaled_dot_product_attention = counted
        try:
            yield
        finally:
            F.scaled_dot_product_attention = inner


def _checked(buffers, dims, keep):
    buffers, dims = list(buffers or []), list(dims or [])
    keep = set(keep or ())
    if not buffers:
        raise HpcError("maybe_context_parallel() was given no buffers, so no sequence would be split while attention "
                       "is", fix="pass buffers=[batch['input_ids'], batch['shift_labels'], ...] and buffer_seq_dims")
    if len(dims) != len(buffers):
        raise HpcError(f"maybe_context_parallel(): {len(buffers)} buffers and {len(dims)} buffer_seq_dims",
                       fix="give one sequence dimension per buffer")
    if not all(isinstance(b, torch.Tensor) for b in buffers):
        raise HpcError("maybe_context_parallel(buffers=...) takes tensors", fix="pass the batch's tensors")
    if len({id(b) for b in buffers}) != len(buffers):
        raise HpcError("maybe_context_parallel(): the same tensor is given twice in buffers (it would be split twice)",
                       fix="give each tensor once")
    if not keep <= set(buffers):
        raise HpcError("maybe_context_parallel(): no_restore_buffers names a tensor that is not in buffers",
                       fix="make no_restore_buffers a subset of buffers")
    lengths = {b.shape[d] for b, d in zip(buffers, dims)}
    if len(lengths) > 1:
        raise HpcError(f"maybe_context_parallel(): the buffers' sequence dimensions differ ({sorted(lengths)})",
                       fix="pass tensors of one sequence length, each with its sequence dimension")
    return buffers, dims, keep
