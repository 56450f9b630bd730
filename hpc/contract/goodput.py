"""Where an attempt's allocation went: its timeline events (hpc/contract/timeline.py) laid over the span the
scheduler gave it, cut into phases that cover the span exactly, so the parts always add up to the allocation.

Phases, in the order an attempt meets them (the JSON keys of `hpc report --json`):

    vetting      the batch script's start to the last node's vetting report (all allocated nodes busy)
    startup      then to the loop's first work: Python, torch, the process group, the model, the resume's load
    training     productive steps: what no later attempt had to train again
    checkpoint   saves that held the loop (an async save: only the part before it returned)
    redone       steps trained after the checkpoint the next attempt resumed from: lost with the attempt
    hang         the silence before the watchdog declared a hang
    stopping     the last recorded moment to the allocation's end: the exit, a kill's wait, the requeue
    unrecorded   an attempt with no timeline at all (no hpc runtime in it, or its rank 0 never started)
    idle_spares  node-seconds of allocated nodes the run did not use (spares SLURM could not take back)

Each phase's node-seconds are its seconds times the nodes that held it (vetting: every allocated node; the rest:
the nodes the run used). Goodput = training node-seconds / allocated node-seconds. Queue time is beside the
allocation (nothing was allocated yet) and reported on its own. Torch-free: the login side's report and the
runtime's end-of-attempt metrics use the same arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PHASES = ("vetting", "startup", "training", "checkpoint", "redone", "hang", "stopping", "unrecorded")
IDLE_SPARES = "idle_spares"
REQUEUED_STATES = {"PENDING", "REQUEUED", "PREEMPTED", "REQUEUE_FED", "REQUEUE_HOLD"}


@dataclass
class Allocation:
    """One run of a job as the scheduler saw it (a row of `sacct -D`)."""

    start: float
    end: float | None  # None: still running
    nodes: int
    hosts: list[str] = field(default_factory=list)
    submit: float | None = None
    state: str = ""


@dataclass
class Attempt:
    number: int
    start: float
    end: float
    nodes: int  # allocated
    used_nodes: int  # the run's own (fewer where spares stayed allocated)
    hosts: list[str]
    state: str  # the scheduler's, where it said
    running: bool
    queued_s: float | None = None
    submitted_at: float | None = None
    vetted_at: float | None = None
    training_at: float | None = None
    first_step_at: float | None = None
    signal_at: float | None = None
    signal: str | None = None
    stopped_at: float | None = None
    last_at: float | None = None
    saves: list[dict] = field(default_factory=list)  # {"t", "step", "stall_s", "async"}
    hangs: list[dict] = field(default_factory=list)
    resumed_from: int | None = None
    step_from: int = 0
    step_to: int = 0
    redone_steps: int = 0
    reason: str = ""
    segments: list[tuple[str, float, float]] = field(default_factory=list)  # (phase, t0, t1), covering the span

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def steps_trained(self) -> int:
        return max(0, self.step_to - self.step_from)

    def phase_seconds(self) -> dict[str, float]:
        out = dict.fromkeys(PHASES, 0.0)
        for name, t0, t1 in self.segments:
            out[name] += t1 - t0
        return out

    def phase_node_seconds(self) -> dict[str, float]:
        out = {name: s * (self.nodes if name == "vetting" else self.used_nodes)
               for name, s in self.phase_seconds().items()}
        after_vetting = self.end - (self.vetted_at if self.vetted_at is not None else self.start)
        out[IDLE_SPARES] = max(0, self.nodes - self.used_nodes) * max(0.0, after_vetting)
        return out

    @property
    def allocated_node_s(self) -> float:
        return self.nodes * self.seconds

    @property
    def productive_node_s(self) -> float:
        return self.phase_node_seconds()["training"]


def _paint(segments: list[tuple[str, float, float]], name: str, t0: float, t1: float,
           only: tuple[str, ...] | None = None) -> list[tuple[str, float, float]]:
    """``segments`` with [t0, t1) given to ``name`` (only where it lay in one of ``only``, if given)."""
    if t1 <= t0:
        return segments
    out = []
    for seg, a, b in segments:
        if b <= t0 or a >= t1 or (only is not None and seg not in only):
            out.append((seg, a, b))
            continue
        if a < t0:
            out.append((seg, a, t0))
        out.append((name, max(a, t0), min(b, t1)))
        if b > t1:
            out.append((seg, t1, b))
    return out


def _by_attempt(events: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for e in events:
        out.setdefault(e["attempt"], []).append(e)
    return out


def _step(e: dict) -> int | None:
    value = e.get("step")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _span_from_events(evs: list[dict], now: float | None) -> tuple[float, float, bool]:
    started = next((e for e in evs if e["event"] == "started"), None)
    start = min(e["t"] for e in evs)
    if started is not None and isinstance(started.get("batch_start"), (int, float)):
        start = min(start, float(started["batch_start"]))
    running = now is not None
    return start, (now if running else max(e["t"] for e in evs)), running


def build(events: list[dict], allocations: list[Allocation] | None = None, *, now: float | None = None,
          vetted: dict[int, float] | None = None, submitted_at: float | None = None) -> list[Attempt]:
    """The attempts of one task. ``allocations``: the scheduler's runs, oldest first (none known: the events'
    own span); ``now``: the time, when the newest attempt is still running; ``vetted``: attempt -> when its last
    vetting report was written; ``submitted_at``: the submission (the first attempt's queue time)."""
    by = _by_attempt(events)
    vetted = vetted or {}
    spans: list[tuple[int, float, float, bool, Allocation | None]] = []
    if allocations:
        numbers = sorted(by)
        for i, alloc in enumerate(allocations):
            running = alloc.end is None
            end = alloc.end if alloc.end is not None else (now if now is not None else alloc.start)
            # the attempt whose events fall inside this run (SLURM's clock and the nodes' agree to a second or
            # two); else the i-th, for a run whose rank 0 wrote nothing
            match = next((n for n in numbers if alloc.start - 5 <= min(e["t"] for e in by[n]) <= end + 5), None)
            number = match if match is not None else (max([s[0] for s in spans], default=-1) + 1)
            spans.append((number, alloc.start, end, running, alloc))
        seen = {s[0] for s in spans}
        for n in numbers:  # the running attempt, not in accounting yet (sacct -c knows ended jobs only)
            if n not in seen and n > max(seen, default=-1):
                start, end, running = _span_from_events(by[n], now)
                spans.append((n, start, end, running, None))
    else:
        for n in sorted(by):
            start, end, running = _span_from_events(by[n], now if n == max(by) else None)
            spans.append((n, start, end, running, None))

    attempts = []
    for number, start, end, running, alloc in spans:
        evs = by.get(number, [])
        started = next((e for e in evs if e["event"] == "started"), None)
        used = started.get("nodes") if started else None
        nodes = alloc.nodes if alloc is not None else (used if isinstance(used, int) else 1)
        used = used if isinstance(used, int) and 0 < used <= nodes else nodes
        a = Attempt(number, start, max(end, start), nodes, used, list(alloc.hosts) if alloc else [],
                    alloc.state if alloc else ("RUNNING" if running else ""), running)
        if alloc is not None and alloc.submit is not None:
            a.submitted_at = alloc.submit
        _fill(a, evs, vetted.get(number))
        attempts.append(a)

    for prev, a in zip(attempts, attempts[1:]):
        a.queued_s = max(0.0, a.start - prev.end)
        nxt = a.resumed_from if a.resumed_from is not None else (0 if a.training_at is not None else None)
        if nxt is not None and prev.step_to > nxt:
            prev.redone_steps = prev.step_to - max(nxt, prev.step_from)
            _mark_redone(prev, nxt)
    if attempts:
        first = attempts[0]
        since = submitted_at if submitted_at is not None else first.submitted_at
        first.queued_s = max(0.0, first.start - since) if since is not None else None
    for a in attempts:
        a.reason = _reason(a, a is attempts[-1])
    return attempts


def _clamp(a: Attempt, t: float | None) -> float | None:
    return None if t is None else min(max(t, a.start), a.end)


def _fill(a: Attempt, evs: list[dict], vetted_at: float | None) -> None:
    if not evs:
        a.segments = [("unrecorded", a.start, a.end)] if a.end > a.start else []
        return
    steps = [s for s in (_step(e) for e in evs) if s is not None]
    started = next((e for e in evs if e["event"] == "started"), None)
    resumed = next((e for e in evs if e["event"] == "resumed"), None)
    a.resumed_from = _step(resumed) if resumed else None
    a.step_from = a.resumed_from if a.resumed_from is not None else ((_step(started) or 0) if started else 0)
    a.step_to = max(steps + [a.step_from])
    a.vetted_at = _clamp(a, vetted_at)
    first = {}
    for e in evs:
        first.setdefault(e["event"], e)
    a.training_at = _clamp(a, first["training"]["t"]) if "training" in first else None
    a.first_step_at = _clamp(a, first["progress"]["t"]) if "progress" in first else None
    if "signal" in first:
        a.signal_at, a.signal = _clamp(a, first["signal"]["t"]), str(first["signal"].get("why", ""))
    stopped = first.get("stopped") or first.get("finished")
    a.stopped_at = _clamp(a, stopped["t"]) if stopped else None
    a.last_at = a.end if a.running else _clamp(a, max(e["t"] for e in evs))
    a.saves = [{"t": _clamp(a, e["t"]), "step": _step(e), "stall_s": float(e.get("stall_s") or 0.0),
                "async": bool(e.get("async"))} for e in evs if e["event"] == "save"]
    a.hangs = [{"t": _clamp(a, e["t"]), "step": _step(e), "idle_s": float(e.get("idle_s") or 0.0)}
               for e in evs if e["event"] == "hang"]

    cursor = a.start
    segs: list[tuple[str, float, float]] = []
    if a.vetted_at is not None and a.vetted_at > cursor:
        segs.append(("vetting", cursor, a.vetted_at))
        cursor = a.vetted_at
    train_end = a.last_at if a.last_at is not None else a.end
    if a.training_at is None:
        segs.append(("startup", cursor, train_end))
    else:
        t = max(cursor, a.training_at)
        segs.append(("startup", cursor, t))
        segs.append(("training", t, max(t, train_end)))
    end_of_run = segs[-1][2]
    if a.end > end_of_run:
        segs.append(("stopping", end_of_run, a.end))
    for s in a.saves:
        segs = _paint(segs, "checkpoint", s["t"] - s["stall_s"], s["t"], only=("training", "startup"))
    for h in a.hangs:
        segs = _paint(segs, "hang", h["t"] - h["idle_s"], h["t"], only=("training",))
    a.segments = [(n, t0, t1) for n, t0, t1 in segs if t1 > t0]


def _mark_redone(a: Attempt, resumed_from: int) -> None:
    """The training after the commit of the checkpoint the next attempt resumed from was done in vain."""
    if a.training_at is None:
        return
    if resumed_from <= a.step_from:
        cut = a.training_at
    else:
        commits = [s["t"] for s in a.saves if s["step"] is not None and s["step"] <= resumed_from]
        cut = max(commits) if commits else a.training_at
    a.segments = _paint(a.segments, "redone", cut, a.end, only=("training",))


def _reason(a: Attempt, last: bool) -> str:
    if a.running:
        return "running"
    said = []
    if a.hangs:
        said.append("hung")
    if a.stopped_at is not None and a.signal:
        said.append(f"stopped at step {a.step_to} on {a.signal}")
    elif a.stopped_at is not None and not last:
        said.append(f"stopped at step {a.step_to}")
    elif a.stopped_at is not None:
        said.append("work done")
    elif a.last_at is not None and a.training_at is not None:
        said.append(f"killed after step {a.step_to} (last recorded)")
    if a.state in REQUEUED_STATES or (not last and a.state not in ("COMPLETED",)):
        said.append("requeued")
    elif a.state:
        said.append(a.state)
    return "; ".join(said) or "unknown"


def totals(attempts: list[Attempt]) -> dict:
    """What the attempts cost together: node-seconds by phase, goodput, queue time, steps."""
    phases = dict.fromkeys((*PHASES, IDLE_SPARES), 0.0)
    for a in attempts:
        for name, ns in a.phase_node_seconds().items():
            phases[name] += ns
    allocated = sum(a.allocated_node_s for a in attempts)
    return {
        "attempts": len(attempts),
        "allocated_node_s": allocated,
        "productive_node_s": phases["training"],
        "goodput": phases["training"] / allocated if allocated > 0 else None,
        "node_s": phases,
        "queued_s": sum(a.queued_s or 0.0 for a in attempts),
        "steps_trained": sum(a.steps_trained for a in attempts),
        "redone_steps": sum(a.redone_steps for a in attempts),
    }
