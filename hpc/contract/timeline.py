"""What an attempt did and when: tasks/<task>.timeline, the events `hpc report` reads (and the runtime itself, for
the goodput it logs at the end of each attempt).

One JSON object a line, appended whole (``append_whole``: O_APPEND, one write, so a torn line can only be the
last one, and it is skipped). Only the job's rank 0 writes, a few lines an attempt plus one ``progress`` line at
most every PROGRESS_EVERY_S of training: nothing a step would notice. Every line has

    t        epoch seconds (float) when it happened (a save's line: when it ended)
    attempt  SLURM_RESTART_COUNT (the local profile's HPC_RESTART_COUNT), 0 for the first run
    event    one of EVENTS

and, by event (missing keys are fine: readers take what is there):

    started   batch_start (epoch s, the batch script's start: tasks/<task>.jobid's mtime), proc_start (epoch s,
              this process's start), nodes (allocated), run_nodes (the nodes the ranks of this run are on),
              nodelist, world, hosts (the run's node hosts, sorted, where known: `replacements` compares them)
    resumed   step (the checkpoint's optimizer step), load_s
    training  step: the loop's first work after the (re)start; from here on time is training
    progress  step: the optimizer steps completed so far (the first step, then every PROGRESS_EVERY_S)
    save      step, stall_s (how long the save held the loop), async (bool)
    signal    why (USR1, TERM, ...): the stop was first seen
    stopped   step, why, requeued (bool): the run stopped at a step boundary
    hang      step, idle_s (how long it had been silent when declared hung)
    finished  step, last_step_t (when the last optimizer step ended): end_training(), the work is done
    ended     step, last_step_t, how, rank: the process is exiting. how "exit": without an uncaught exception (the
              script returned, called sys.exit, or stop_here exited); "exception": with one (error: its type). Rank 0
              writes it at every exit; on an exception the first rank of every node does too, so that the
              survivors of a lost node say which step the run had reached. The scheduler's state says the rest.

Torch-free: the runtime writes it, the login side (hpc/cluster/report.py) and the notices read it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hpc.contract import layout
from hpc.contract.atomic import append_whole

EVENTS = ("started", "resumed", "training", "progress", "save", "signal", "stopped", "hang", "finished", "ended")
PROGRESS_EVERY_S = 10.0  # how stale the last known step of an attempt killed without notice may be
EVERY_ENV = "HPC_TIMELINE_EVERY_S"  # a shorter interval, for tests that kill an attempt seconds after it started
MAX_BYTES = 16 << 20  # a reader's bound: a timeline is a few KB a day; anything far bigger is not one


def progress_every_s() -> float:
    try:
        return max(0.1, float(os.environ.get(EVERY_ENV) or PROGRESS_EVERY_S))
    except ValueError:
        return PROGRESS_EVERY_S


def attempt() -> int:
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or os.environ.get("HPC_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def path(job_dir: str | os.PathLike, task: str) -> Path:
    return Path(layout.JobFolder(job_dir).task(task, layout.TaskFile.TIMELINE))


def append(file: str | os.PathLike, event: str, **fields) -> bool:
    """One event line; whether it was written. Never raises: a missing line costs a report's detail, never a run."""
    line = {"t": round(time.time(), 3), "attempt": attempt(), "event": event, **fields}
    try:
        append_whole(file, json.dumps(line, separators=(",", ":"), default=str) + "\n")
    except (OSError, ValueError, TypeError):
        return False
    return True


def parse(text: str) -> list[dict]:
    """The events of a timeline's text, in file order. The last line without its newline (a torn write) and lines
    that do not read as an event are skipped."""
    out = []
    for line in text.split("\n")[:-1]:
        try:
            event = json.loads(line)
            if isinstance(event, dict) and isinstance(event.get("event"), str):
                event["t"], event["attempt"] = float(event["t"]), int(event["attempt"])
                out.append(event)
        except (ValueError, KeyError, TypeError):
            continue
    return out


def read(job_dir: str | os.PathLike, task: str, files=None) -> list[dict]:
    """A task's events; ``files``: the job folder as its backend reads it (over SSH for a remote cluster). None
    there or unreadable: no events."""
    name = f"{layout.TASKS}/{task}.{layout.TaskFile.TIMELINE}"
    try:
        data = files.read(name) if files is not None else path(job_dir, task).read_bytes()[:MAX_BYTES]
    except OSError:
        return []
    if not data:
        return []
    return parse(data.decode(errors="replace") if isinstance(data, bytes) else data)


def replacements(events: list[dict]) -> list[dict]:
    """Nodes another node replaced within an attempt (an elastic job's hot spare joining the next round in a lost
    node's place): ``{"lost", "by", "step", "attempt"}`` each, oldest first. From consecutive ``started`` lines with
    ``hosts``: a host gone from one round to the next, paired (in name order) with one that came; ``step``: where
    the new round resumed (its ``resumed`` line, else its ``started`` line's)."""
    out, previous = [], {}
    for i, event in enumerate(events):
        if event.get("event") != "started" or not isinstance(event.get("hosts"), list):
            continue
        attempt, hosts = event["attempt"], {str(h) for h in event["hosts"]}
        before = previous.get(attempt)
        previous[attempt] = hosts
        if before is None:
            continue
        step = event.get("step")
        for later in events[i + 1:]:
            if later.get("event") == "started":
                break
            if later.get("event") == "resumed":
                step = later.get("step", step)
                break
        for lost, by in zip(sorted(before - hosts), sorted(hosts - before)):
            out.append({"lost": lost, "by": by, "step": step, "attempt": attempt})
    return out
