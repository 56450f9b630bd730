"""What each recovery cost: the time from the commit of the checkpoint a run went on from to training again,
cut into its parts. A recovery is what lies between two attempts of a task (hpc/contract/goodput.py's, oldest
first): an elastic restart inside the allocation (a lost node or rank) or a requeue (a preemption, the time limit,
a crash).

    redone     the commit of the checkpoint the next run resumed from to the failed run's last optimizer step:
               the work lost, trained again (``redone_steps`` steps)
    detection  that last step to when the fault was noticed: the hang watchdog's declaration, else the
               survivors' exit by an exception (their ``ended`` line), else the stop signal, else any exit, else
               the run's last sign of life (an elastic run's last line; a requeued attempt's end as the scheduler
               saw it)
    restart    then to the new processes' ``started`` line: torchrun's relaunch; or a requeue's rest of the failed
               allocation (the exit, the job script's last lines, up to ``released_at``), its ``queued_s`` and the
               new allocation's start; then the processes' imports and their rendezvous
    startup    then to the new run's first work: the model, the resume's load (``load_s``, from ``tier``)

The four add up to ``total_s`` exactly: each moment is held at or after the one before it (clocks of several
nodes, a graceful stop whose checkpoint is written after its signal). The last step is the failed processes'
``ended.last_step_t`` where a process noted its exit, else the last ``progress`` line's (written at most every
10 s: then detection reads up to that much long; ``last_step_from`` says which). A recovery with no timeline on
either side has its parts None. Torch-free.
"""

from __future__ import annotations

from hpc.contract.goodput import Attempt, commit_at

PARTS = ("redone_s", "detection_s", "restart_s", "startup_s")


def recoveries(attempts: list[Attempt]) -> list[dict]:
    """Each pair of consecutive attempts of one task as a recovery (JSON-ready)."""
    return [between(prev, nxt) for prev, nxt in zip(attempts, attempts[1:])]


def between(prev: Attempt, nxt: Attempt) -> dict:
    elastic = nxt.run > 0 and nxt.number == prev.number
    out = {"attempt": nxt.number, "run": nxt.run, "after_attempt": prev.number, "after_run": prev.run,
           "kind": "elastic restart" if elastic else "requeue", "cause": prev.reason,
           "lost": _lost(prev, nxt), "spare": _spare(prev, nxt),
           "queued_s": 0.0 if elastic else nxt.queued_s,
           "released_at": None if elastic else prev.end,  # a requeue: the failed attempt's allocation ended
           "redone_steps": prev.redone_steps, "resumed_from": nxt.resumed_from,
           "load_s": nxt.load_s, "tier": nxt.resumed_tier, "folder": nxt.resumed_folder,
           "commit_at": None, "last_step_at": None, "last_step_from": None, "detected_at": None, "detected_by": None,
           "started_at": nxt.started_at, "training_at": nxt.training_at, "total_s": None,
           **dict.fromkeys(PARTS)}
    if prev.training_at is None or nxt.training_at is None or nxt.started_at is None:
        return out  # no timeline on one side (or the new run never trained): nothing to cut
    detected, by = _detected(prev)
    last, source = _last_step(prev, detected)
    commit = commit_at(prev, nxt.resumed_from if nxt.resumed_from is not None else prev.step_from)
    moments = [commit, last, detected, nxt.started_at, nxt.training_at]
    for i in range(1, len(moments)):  # each at or after the one before: the parts are never negative
        moments[i] = max(moments[i], moments[i - 1])
    parts = [b - a for a, b in zip(moments, moments[1:])]
    out.update(dict(zip(PARTS, parts)), commit_at=moments[0], last_step_at=moments[1], last_step_from=source,
               detected_at=moments[2], detected_by=by, total_s=moments[-1] - moments[0])
    return out


def _lost(prev: Attempt, nxt: Attempt) -> list[str]:
    """The nodes the failed run had and the next one has not (a spare's lost node, as it said)."""
    if nxt.replaced and nxt.replaced.get("lost"):
        return [nxt.replaced["lost"]]
    if prev.run_hosts and nxt.run_hosts:
        return sorted(set(prev.run_hosts) - set(nxt.run_hosts))
    return []


def _spare(prev: Attempt, nxt: Attempt) -> str | None:
    """The node(s) that took the lost ones' places: as the run said, else those the next run has and the failed
    one had not (an elastic job's hot spare joining the next round)."""
    if nxt.replaced:
        return nxt.replaced.get("spare")
    came = sorted(set(nxt.run_hosts) - set(prev.run_hosts)) if prev.run_hosts and nxt.run_hosts else []
    return ",".join(came) or None


def _detected(a: Attempt) -> tuple[float, str]:
    if a.hangs and a.hangs[0]["t"] is not None:  # the watchdog declared it: its timeout is the detection
        return a.hangs[0]["t"], "hang watchdog"
    if a.failed_at is not None:
        return a.failed_at, f"exception ({a.error})"
    if a.signal_at is not None:
        return a.signal_at, f"signal {a.signal}"
    if a.ended_at is not None:
        return a.ended_at, "exit"
    return a.end, "last line" if a.restarted else "scheduler's end"


def _last_step(a: Attempt, detected: float) -> tuple[float, str | None]:
    """The last optimizer step known to have ended by ``detected``: a process's exit line knows it to the
    millisecond, a progress line to PROGRESS_EVERY_S."""
    known = [t for t in a.step_ends if t <= detected]
    if not known:
        return a.training_at or a.start, None
    return max(known), "exit line" if max(known) == a.exit_step_at else "progress line"


def summary(recs: list[dict]) -> dict:
    """The recoveries together: how many, and their parts summed (those with a timeline on both sides)."""
    cut = [r for r in recs if r["total_s"] is not None]
    return {"recoveries": len(recs), "recovery_s": sum(r["total_s"] for r in cut),
            **{f"recovery_{p}": sum(r[p] for r in cut) for p in PARTS}}
