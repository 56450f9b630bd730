"""Stopping inside join_uneven_inputs: the stop vote of the ranks still training and of those that have joined.

Inside torch's Join a rank out of batches no longer runs the loop: it runs each joinable's shadow hooks, once per
forward of the ranks still training, until every rank has joined. hpc's regular vote (stop_vote.py) rides on the
loop's steps and collectives, which a joined rank does not make, so it is held back inside the block. The join vote
rides on what every rank does once per iteration of the ranks still training:

- hpc's own Joinable goes FIRST in the block's joinables (same process group and device as the DDP models), so its
  notice is the block's count all-reduce and DDP's own is vacuous (DDP only needs the work handle with
  divide_by_initial_world_size=False; the block uses torch's default, True);
- a rank still training gives that notice in a forward pre-hook of the first DDP model, then casts its join vote: one
  blocking all-reduce (MAX) on a gloo group of the vote's own (made at the first block, by every rank at its entry);
- a joined rank casts the same vote from hpc's JoinHook.main_hook(), which torch runs before DDP's.

So every rank casts one join vote per iteration, in the same order, whatever the accumulation style. The vote
carries the stop code (the signal watch's, or a stop agreed earlier) and, of each rank still training, whether it
is at an optimizer-step boundary (no gradient accumulated since its last step), its counters and its loaders'
points. When the agreed vote says stop and the checkpoint can be exact, every rank stops at that same iteration,
before any of its collectives: the ranks still training in the pre-hook (their batch fetched and untrained: the
checkpoint's data point is the last step's, see TrainingState.optimizer_stepped), the joined ones in main_hook.
Joined ranks take the counters and loader points of the ranks still training; if rank 0 (which writes the shared
state of a DDP checkpoint) has joined, the lowest rank still training sends it models, optimizers, schedulers,
the scaler and the registered objects. Then the stop runs as anywhere else: save_state, requeue or exit.

When the checkpoint could not be exact the stop is deferred, in one line saying why, to a later iteration or to the
first vote after the block: a rank inside an accumulation window, ranks still training at different steps or data
points (an epoch loop inside the block: the ranks drift apart by a batch each epoch), a joined rank that trained
data past the others' point. Joinables other than DDP models get no join vote at all (a stop is seen after the
block, as before). At the block's end every rank takes the counters of the last rank to join, as DDP's own
post-hook takes its parameters, so step counts (checkpoint folders, the straggler check's windows) stay alike.
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_map

from hpc.runtime.data.position import EpochPoint
from hpc.runtime.process.seed import rng_state, set_rng_state
from hpc.runtime.resilience import preemption

_NONE = -(2**62)  # what a joined rank gives for the fields only the ranks still training fill (MAX ignores it)
_HEAD = 5  # code, not at a boundary, -rank, and (steps, -steps) ...


class JoinVote:
    """The run guard's stop vote inside join_uneven_inputs (see the module's docstring)."""

    def __init__(self, guard):
        self.guard = guard
        self.inside = 0  # join blocks this rank is in
        self._group = None
        self._grad_step: int | None = None  # completed_steps when a gradient last accumulated
        self._noted: set[str] = set()
        self.rng_at_batch: dict | None = None  # inside a block: the random state as the last batch came

    def batch_came(self) -> None:
        """A loader handed a batch inside a block (the stop, if any, comes at its forward)."""
        if self.inside:
            self.rng_at_batch = rng_state()

    def __getstate__(self) -> dict:  # a pickled Accelerator's copy: no process group, no block
        return {**self.__dict__, "_group": None, "inside": 0}

    # --- the block ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def block(self, joinables: list):
        """Around torch's Join: yields the joinables to give it (hpc's first, where it can stop inside)."""
        self.inside += 1
        try:
            why = _unsupported(joinables) if self.guard.process.distributed else "one process"
            if why is None and self.inside > 1:  # a second hook on the same model would vote twice a forward
                why = "a join_uneven_inputs block inside another"
            if why is None and self.guard.options.script_resumes:
                why = "the script resumes from checkpoints in its own naming, which hpc takes at a batch boundary"
            if why:
                self._note(f"a stop asked for inside join_uneven_inputs is taken after the block: {why}")
                yield joinables
                return
            if self._group is None:  # every rank enters the block at the same point
                self._group = dist.new_group(backend="gloo")
            models = [m for m in joinables if isinstance(m, DistributedDataParallel)]
            hpc_joinable = _HpcJoinable(self, models[0])
            params = [p for m in models for p in m.parameters() if p.requires_grad]
            self._grad_step = self.guard.training.completed_steps - 1
            grads = [p.grad.any() for p in params if p.grad is not None]
            if grads and bool(torch.stack(grads).any()):  # a window open at the block's entry (one device sync)
                self._grad_step = self.guard.training.completed_steps
            handles = [models[0].register_forward_pre_hook(hpc_joinable.pre_forward)]
            handles += [p.register_post_accumulate_grad_hook(self._accumulated) for p in params]
            try:
                yield [hpc_joinable, *joinables]
            finally:
                for handle in handles:
                    handle.remove()
        finally:
            self.inside -= 1
            if not self.inside:
                self.rng_at_batch = None

    def _accumulated(self, _param) -> None:
        self._grad_step = self.guard.training.completed_steps

    def _note(self, line: str) -> None:
        if line not in self._noted:
            self._noted.add(line)
            if self.guard.process.is_main_process:
                preemption.log(line)

    # --- the vote -------------------------------------------------------------------------------------
    def cast(self, joined: bool) -> None:
        """One iteration's vote, on every rank (the pre-hook or main_hook); stops the run here when agreed."""
        guard, training = self.guard, self.guard.training
        code = max(guard.watch.local_code(), guard.stop_code, guard.stop_vote.agreed)
        if joined:
            fields = [code, 0, _NONE] + [_NONE] * (4 + 4 * len(training.loaders))
        else:
            fields = [code, int(self._grad_step is not None and self._grad_step >= training.completed_steps),
                      -guard.process.rank]
            for value in (training.completed_steps, training.micro_step_at_step):
                fields += [value, -value]
            for loader in training.loaders:
                point = loader.point()
                fields += [point.epoch, -point.epoch, point.consumed, -point.consumed]
        vote = torch.tensor(fields, dtype=torch.int64)
        dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self._group)
        agreed = vote.tolist()
        if not agreed[0]:
            return
        pairs = [(agreed[i], -agreed[i + 1]) for i in range(3, len(agreed), 2)]
        why = None
        if agreed[1]:
            why = "a rank is inside an accumulation window (its gradients are in no checkpoint)"
        elif any(high != low for high, low in pairs[:2]):
            why = "the ranks still training have taken different numbers of steps"
        elif any(high != low for high, low in pairs[2:]):
            why = "the ranks still training stand at different points of their data (an epoch loop inside the " \
                  "block: each epoch leaves them a batch further apart)"
        steps, micro = pairs[0][0], pairs[1][0]
        points = [EpochPoint(pairs[2 + 2 * i][0], pairs[3 + 2 * i][0], loader.unit, loader.shape)
                  for i, loader in enumerate(training.loaders)]
        if why is None:  # every rank knows the point now: a joined rank says whether it trained past it
            past = torch.tensor([int(joined and self._past(points))], dtype=torch.int64)
            dist.all_reduce(past, op=dist.ReduceOp.MAX, group=self._group)
            if past.item():
                why = "a rank that joined has trained data past the point of the ranks still training"
        if why is not None:
            self._note(f"stop ({_reason(guard, agreed[0])}) inside join_uneven_inputs deferred: {why}; it is taken "
                       "at the first point every rank can reach")
            return
        self._stop(agreed[0], -agreed[2], steps, micro, points, joined)

    def _past(self, points: list[EpochPoint]) -> bool:
        """A joined rank: whether its loaders trained anything the point does not cover (then the resumed run
        would train it twice). A loader whose pass ended stands at the next epoch's start."""
        for loader, point in zip(self.guard.training.loaders, points):
            mine = loader.point()
            if mine == point:
                continue
            try:
                over = loader.remaining_from(point.consumed) == 0
            except TypeError:  # a stream of unknown length: whether it went past cannot be known, so it did
                return True
            if (mine.epoch, mine.consumed) == (point.epoch + 1, 0) and over:
                continue  # its pass is over, and nothing of it came after the point
            return True
        return False

    def _stop(self, code: int, source: int, steps: int, micro: int, points: list[EpochPoint], joined: bool) -> None:
        guard, training = self.guard, self.guard.training
        if joined:
            training.completed_steps, training.micro_step = steps, micro
            training.micro_step_at_step = micro
            for loader, point in zip(training.loaders, points):
                loader.continue_from(point)
        if source != 0:  # rank 0 writes the shared state and has joined: it takes the trained state
            self._send_state(source)
        reason = _reason(guard, code)
        if not guard.stop_code:
            guard.stop_reason = reason
            guard.timeline.signal(reason)
        guard.stop_code = max(guard.stop_code, code)
        if self.rng_at_batch is not None and not joined:
            # the stop comes at the model's forward: what the script drew since its batch came (noise, masks,
            # dropout seeds) must be drawn again after the resume, from the state the batch came with
            set_rng_state(self.rng_at_batch)
        preemption.log(f"rank {guard.process.rank}: stop ({reason}) agreed inside join_uneven_inputs at step "
                       f"{steps}" + (" (this rank has joined)" if joined else ""))
        guard.stop_here(guard.save_state(None, async_save=False))
        sys.exit(1)  # not reached: stop_here exits

    def _send_state(self, source: int) -> None:
        training, rank = self.guard.training, self.guard.process.rank
        if rank not in (0, source):
            return
        objects = [m.module if isinstance(m, DistributedDataParallel) else m for m in training.models]
        objects += [*training.optimizers, *training.schedulers, *training.custom_objects]
        scaler = self.guard.checkpoints.precision.scaler
        if scaler is not None:
            objects.append(scaler)
        box = [None]
        if rank == source:
            box = [[tree_map(lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v, o.state_dict())
                    for o in objects]]
            dist.send_object_list(box, dst=0, group=self._group)
            return
        dist.recv_object_list(box, src=source, group=self._group)
        for obj, state in zip(objects, box[0]):
            obj.load_state_dict(state)

    def after_block(self, is_last_joiner: bool) -> None:
        """Every rank, as the block ends: the counters of the last rank to join (the highest, as DDP's choice)."""
        training = self.guard.training
        rank = torch.tensor([self.guard.process.rank if is_last_joiner else -1], dtype=torch.int64)
        dist.all_reduce(rank, op=dist.ReduceOp.MAX, group=self._group)
        counters = torch.tensor([training.completed_steps, training.micro_step, training.micro_step_at_step],
                                dtype=torch.int64)
        dist.broadcast(counters, src=int(rank.item()), group=self._group)
        training.completed_steps, training.micro_step, training.micro_step_at_step = counters.tolist()


def _reason(guard, code: int) -> str:
    if guard.stop_code and guard.stop_reason:
        return guard.stop_reason
    if guard.watch.code == code and guard.watch.received:
        return guard.watch.received
    return "TERM on another rank" if code == preemption.STOP else "warning signal on another rank"


def _unsupported(joinables: list) -> str | None:
    """Why hpc cannot make an exact checkpoint inside this block, or None."""
    others = [type(j).__name__ for j in joinables if not isinstance(j, DistributedDataParallel)]
    if others:
        return f"joinables other than DDP models ({', '.join(others)}) keep state hpc cannot take from a rank " \
               "still training"
    if not joinables:
        return "no joinables"
    return None


class _HpcJoin(JoinHook):
    def __init__(self, vote: JoinVote):
        self.vote = vote

    def main_hook(self) -> None:  # a joined rank, once per iteration of the others, before DDP's hook
        self.vote.cast(joined=True)

    def post_hook(self, is_last_joiner: bool) -> None:
        self.vote.after_block(is_last_joiner)


class _HpcJoinable(Joinable):
    """First in the block: its notice is the count all-reduce of torch's Join."""

    def __init__(self, vote: JoinVote, model: DistributedDataParallel):
        super().__init__()
        self.vote, self.model = vote, model

    def join_hook(self, **kwargs) -> JoinHook:
        return _HpcJoin(self.vote)

    @property
    def join_device(self) -> torch.device:
        return self.model.join_device

    @property
    def join_process_group(self):
        return self.model.join_process_group

    def pre_forward(self, _module, _args) -> None:
        """A rank still training, before DDP's own forward: notice given, vote cast."""
        work = Join.notify_join_context(self)
        if work is not None:
            work.wait()
        self.vote.cast(joined=False)
