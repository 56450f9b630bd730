"""Agreeing on a stop without a collective of the reader's own.

Every rank must stop at the same step (a checkpoint is a collective), but a signal reaches ranks at different
moments, and reading `accelerator.should_stop` must not run a collective: a property read on one rank only would
then pair with another rank's unrelated collective and hang the job. So the ranks vote where they already meet:
at each optimizer step and each explicit collective (gather, reduce, wait_for_everyone, ...), which every rank
makes in the same order, each rank sends its reason to stop in a one-number all-reduce that runs in the
background. Reading the result waits for the votes already under way on every rank (it cannot hang).

The votes travel over gloo, on the CPU, also in NCCL jobs (a group of their own), so reading one never waits for
the GPU's queued work.
"""

from __future__ import annotations

import collections
import contextlib
import weakref

import torch
import torch.distributed as dist

_MAX_PENDING = 8  # votes still travelling; older ones are waited for (they finish in microseconds)
_votes: "weakref.WeakSet[StopVote]" = weakref.WeakSet()


def finish_all() -> None:
    """Before the process group goes away (PartialState().destroy_process_group()): every vote completed."""
    for vote in list(_votes):
        vote.finish()


class StopVote:
    def __init__(self, distributed: bool, backend: str | None):
        self.distributed = distributed
        self.agreed = 0
        self._pending: collections.deque = collections.deque()
        self._group = None
        self._held = 0
        _votes.add(self)
        if distributed and backend is not None and "gloo" not in backend:
            self._group = dist.new_group(backend="gloo")  # every rank, at the same point: the Accelerator's start

    @contextlib.contextmanager
    def held_back(self):
        """No votes inside the block (join_uneven_inputs: a rank out of batches runs DDP's shadow collectives only,
        so a vote of the others would pair with one of them or wait for it forever). A stop signal that came
        meanwhile is kept by the signal watch and goes out with the next vote after the block."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1

    def cast(self, code: int) -> None:
        """At a point every rank reaches in the same order: send this rank's reason to stop (0: none)."""
        if not self.distributed or self._held:
            return
        while self._pending and (len(self._pending) >= _MAX_PENDING or self._pending[0][0].is_completed()):
            self._await_all_reduce()
        flag = torch.tensor([code], dtype=torch.int32)
        self._pending.append((dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True), flag))

    def result(self, local_code: int) -> int:
        """The largest reason any rank gave in the votes so far (this rank's own without a process group)."""
        if not self.distributed:
            return local_code
        self.finish()
        return self.agreed

    def _await_all_reduce(self) -> None:
        work, flag = self._pending.popleft()
        work.wait()
        self.agreed = max(self.agreed, int(flag.item()))

    def finish(self) -> None:
        """Before the process group goes away: every vote must have completed."""
        while self._pending:
            self._await_all_reduce()
