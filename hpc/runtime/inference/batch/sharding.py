"""Which chunks of a batch-inference job are whose: array tasks split them by number, ranks share a task's rest.

An array task owns the chunks whose number is its place in the array modulo the array's size: fixed, so tasks
that run at different times (or again, after a requeue) never touch each other's. Within a task, the chunks not
yet committed when the attempt starts are dealt out round-robin over its ranks, so a resumed attempt spreads
what is left evenly, whatever each rank finished before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpc.errors import HpcError


@dataclass(frozen=True)
class ArrayPlace:
    task: int  # 0 .. num_tasks - 1: this task's place in the array, not its SLURM id
    num_tasks: int

    def owns(self, chunk: int) -> bool:
        return chunk % self.num_tasks == self.task


def array_place(task: int | None = None, num_tasks: int | None = None) -> ArrayPlace:
    """This process's place in its job array (0 of 1 outside one), or the script's own split."""
    if (task is None) != (num_tasks is None):
        raise HpcError("pass task and num_tasks together, or neither", fix="e.g. task=3, num_tasks=10")
    if task is None:
        task, num_tasks = _from_slurm(os.environ)
    if not (isinstance(num_tasks, int) and num_tasks >= 1 and isinstance(task, int) and 0 <= task < num_tasks):
        raise HpcError(f"task {task!r} of num_tasks {num_tasks!r} is no place in an array",
                       fix="pass 0 <= task < num_tasks")
    return ArrayPlace(task, num_tasks)


def _from_slurm(env) -> tuple[int, int]:
    if not env.get("SLURM_ARRAY_TASK_ID"):
        return 0, 1
    try:
        task_id, low, high = (int(env[k]) for k in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN",
                                                    "SLURM_ARRAY_TASK_MAX"))
        step = int(env.get("SLURM_ARRAY_TASK_STEP") or 1)
        count = int(env["SLURM_ARRAY_TASK_COUNT"])
    except (KeyError, ValueError):
        count = step = low = high = task_id = -1
    # only an evenly spaced array (0-99, 0-98:2) tells every task its place; ids like 1,5,7 do not
    if step < 1 or count != (high - low) // step + 1 or (task_id - low) % step:
        raise HpcError(f"array task {env.get('SLURM_ARRAY_TASK_ID')} of an unevenly spaced array (ids "
                       f"{env.get('SLURM_ARRAY_TASK_MIN')}..{env.get('SLURM_ARRAY_TASK_MAX')}, "
                       f"{env.get('SLURM_ARRAY_TASK_COUNT')} tasks): its share of the items is unknown",
                       fix="submit the array as a range (--array 0-N), or pass task= and num_tasks= yourself")
    return (task_id - low) // step, count


def deal(pending: list[int], rank: int, world: int) -> list[int]:
    """This rank's chunks of the task's pending ones."""
    return pending[rank::world]
