"""No progress, no endless requeue: a job whose newest checkpoint did not advance over K attempts stops.

The job notes its progress as it commits it, in tasks/<task>.progress, a line each: "<attempt> <value>", the value
a monotone measure (the optimizer step of a committed checkpoint), or "<attempt> +" where an attempt did something
new that has no such measure (a batch-inference rank's first new chunk). The attempt is SLURM_RESTART_COUNT (the
local profile's HPC_RESTART_COUNT), 0 for the first. An attempt made progress if it noted "+", or a value above
every value noted in earlier attempts: a checkpoint saved again at the same step is none. Before a requeue the
batch script asks

    python -m hpc.runtime.resilience.progress_guard JOB_DIR TASK ATTEMPT K

which prints the reason (one line) and exits 3 when none of the K attempts up to ATTEMPT made progress (K is
preemption.max_attempts_without_progress; 0: never); else, or when the guard itself fails (said on stderr), it
exits 0: a broken guard never stops a healthy job. Torch-free: it runs in the batch shell.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpc.contract import layout
from hpc.contract.atomic import append_whole
from hpc.runtime.resilience import preemption

STOP = 3  # the CLI's exit code when the job must not run again
DONE = "+"  # an attempt's note of progress that has no value

_done_noted: set[tuple[str, int]] = set()  # (progress file, attempt) this process noted DONE in


def note(value: int) -> None:
    """This attempt committed progress ``value`` (a checkpoint's optimizer step). No-op outside a job."""
    _append(str(int(value)))


def note_done() -> None:
    """This attempt committed something new with no value to say how far (a batch-inference chunk); noted once
    per process and attempt, however often it is called."""
    path, attempt = _where()
    if path is None or (path, attempt) in _done_noted:
        return
    if _append(DONE):
        _done_noted.add((path, attempt))


def _where() -> tuple[str | None, int]:
    path = layout.this_task_file(layout.TaskFile.PROGRESS)
    if path is None:
        return None, 0
    try:
        return path, preemption.requeue_count()
    except ValueError:
        return None, 0


def _append(what: str) -> bool:
    """One line, appended in one write (O_APPEND: notes of concurrent ranks never interleave); whether it was."""
    path, attempt = _where()
    if path is None:
        return False
    try:
        append_whole(path, f"{attempt} {what}\n")
    except OSError:
        return False  # a missing note costs at most a requeue the guard would have allowed anyway
    return True


def records(job_dir: str | os.PathLike, task: str) -> list[tuple[int, int | None]]:
    """The notes: (attempt, value), None for DONE. A line cut short by a crash (the last, without its newline) and
    lines that do not read are skipped. No file: no notes; any other failure to read it raises."""
    try:
        text = Path(layout.JobFolder(job_dir).task(task, layout.TaskFile.PROGRESS)).read_text(errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in text.split("\n")[:-1]:  # what follows the last newline is a torn write
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            out.append((int(parts[0]), None if parts[1] == DONE else int(parts[1])))
        except ValueError:
            continue
    return out


def verdict(job_dir: str | os.PathLike, task: str, attempts: list[int] | int, k: int) -> str | None:
    """None when the job may run again; else why not, in one line. ``attempts``: the attempt that just ran (every
    one from 0 up to it ran), or the numbers of the attempts that ran. Stops when the ``k`` most recent of them
    all made no progress (an attempt that noted nothing made none); ``k`` 0 never stops."""
    ran = sorted(set(range(attempts + 1) if isinstance(attempts, int) else attempts))
    if k <= 0 or len(ran) < k:
        return None
    window, last = ran[-k:], ran[-1]
    by_attempt: dict[int, list[int | None]] = {}
    for attempt, value in records(job_dir, task):
        if attempt <= last:
            by_attempt.setdefault(attempt, []).append(value)
    best = best_at = done_at = None
    progressed = set()
    for attempt in sorted(by_attempt):
        values = [v for v in by_attempt[attempt] if v is not None]
        top = max(values, default=None)
        if top is not None and (best is None or top > best):
            best, best_at = top, attempt
            progressed.add(attempt)
        if None in by_attempt[attempt]:
            done_at = attempt
            progressed.add(attempt)
    if progressed.intersection(window):
        return None
    contiguous = window == list(range(window[0], last + 1))
    span = f"{window[0]}-{last}" if contiguous else ", ".join(map(str, window))
    head = f"no progress in the last attempt ({last})" if k == 1 else f"no progress over the last {k} attempts ({span})"
    if best is not None:
        return f"{head}: the newest checkpoint is still step {best}, committed in attempt {best_at}"
    if done_at is not None:
        return f"{head}: nothing new was committed in any of them (the last new work was in attempt {done_at})"
    return f"{head}: no checkpoint was committed in any of them"


def main(argv: list[str]) -> int:
    try:
        if len(argv) != 4:
            raise ValueError("usage: python -m hpc.runtime.resilience.progress_guard JOB_DIR TASK ATTEMPT K")
        reason = verdict(argv[0], argv[1], int(argv[2] or 0), int(argv[3]))
    except Exception as e:  # noqa: BLE001 - a broken guard must never stop a healthy job
        print(f"hpc: the progress guard could not decide ({' '.join(str(e).split()) or type(e).__name__}): "
              f"the job may run again", file=sys.stderr)
        return 0
    if reason is None:
        return 0
    print(reason, flush=True)
    return STOP


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
