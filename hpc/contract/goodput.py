"""Where an attempt's allocation went: its timeline events (hpc/contract/timeline.py) laid over the span the
scheduler gave it, cut into phases that cover the span exactly, so the parts always add up to the allocation.

Phases, in the order an attempt meets them (the JSON keys of `hpc report --json`):

    vetting      the batch script's start to the last node's vetting report (all allocated nodes busy)
    startup      then to the loop's first work: Python, torch, the process group, the model, the resume's load
    training     productive steps: what no later attempt had to train again
    checkpoint   saves that held the loop (an async save: only the part before it returned); the fast tier's
                 stall, known as a sum per progress line, is moved here from the training its line falls in (in
                 the figures; the drawn segments keep it as training)
    redone       steps trained after the checkpoint the next attempt resumed from: lost with the attempt
    hang         the silence before the watchdog declared a hang
    restart      an elastic restart inside the allocation: from the lost run's last sign of life to the new
                 processes' start (noticing the loss, the rendezvous' wait, starting the processes)
    stopping     a stop's or a kill's end: the stop (or the last recorded moment) to the allocation's end, that is
                 the exit, a kill's wait, the requeue
    ending       a run that ended by itself (the script returned, end_training, an exit, an exception): from its
                 last optimizer step to the allocation's end, that is a final evaluation or save, the
                 interpreter's exit and the launcher's and batch script's last lines
    unrecorded   an attempt with no timeline at all (no hpc runtime in it, or its rank 0 never started)
    idle_spares  node-seconds of allocated nodes the run did not use (spares SLURM could not take back)

An elastic job's restarts inside one allocation (torchrun's worker groups: a ``started`` line of a new rank-0
process) are attempts of their own here, each a slice of the allocation: the steps a lost run trained after the
checkpoint the next one resumed from are redone, and the wait between them is restart time, not training.

Each phase's node-seconds are its seconds times the nodes that held it (vetting: every allocated node; the rest:
the nodes the run used). Goodput = training node-seconds / allocated node-seconds. Queue time is beside the
allocation (nothing was allocated yet) and reported on its own. Torch-free: the login side's report and the
runtime's end-of-attempt metrics use the same arithmetic.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

PHASES = ("vetting", "startup", "training", "checkpoint", "redone", "hang", "restart", "stopping", "ending",
          "unrecorded")
SCHEDULER_CLOCK_S = 1.0  # sacct's times are whole seconds (cut off): an event up to this much after "End" is in
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
    run: int = 0  # the elastic restart inside the allocation: 0, then 1, 2, ... for torchrun's later worker groups
    restarted: bool = False  # an elastic restart followed inside the same allocation
    proc_start_at: float | None = None  # the run's rank 0 process started (after a restart: the new processes)
    ended_at: float | None = None  # the first process exit noted (the timeline's "ended")
    ended_how: str | None = None  # "exit" or "exception"
    error: str | None = None  # an exception's type, as the exiting process named it
    failed_at: float | None = None  # the first exit by an exception noted: the survivors noticed the fault
    started_at: float | None = None  # the run's "started" line: its processes up and in their process group
    run_hosts: list[str] = field(default_factory=list)  # the run's own nodes, as its rank 0 saw them
    replaced: dict | None = None  # {"lost", "spare"}: a hot spare took a lost node's place for this run
    load_s: float | None = None  # the resume's load
    resumed_tier: str | None = None  # where it read the checkpoint: "node", "peer" or "shared" (None: not said)
    resumed_folder: str | None = None
    step_ends: list[float] = field(default_factory=list)  # when known optimizer steps ended (progress, exit lines)
    exit_step_at: float | None = None  # the last optimizer step as an exiting process noted it (to the ms)
    fast: dict | None = None  # the fast tier's saves: {"saves", "stall_s", "busy_s", "step", "replicas"} (None: none)
    fast_commits: list[tuple[float, int]] = field(default_factory=list)  # (progress line's t, fast tier's step)
    fast_stalls: list[tuple[float, float]] = field(default_factory=list)  # (progress line's t, stall since the last)

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
        # the fast tier's stall is the loop's, checkpoint time: known as a sum per progress line (a day of them
        # would be thousands of slivers to draw), it moves from the training its line falls in, not in segments
        moved = min(out["training"], self._fast_stall_in("training", "checkpoint"))
        out["training"] -= moved
        out["checkpoint"] += moved
        return out

    def _fast_stall_in(self, *phases: str) -> float:
        if not self.fast_stalls or not self.segments:
            return 0.0
        ends = [t1 for _, _, t1 in self.segments]  # in time order, covering the span
        total = 0.0
        for t, stall in self.fast_stalls:
            i = bisect.bisect_left(ends, t)
            if i < len(ends) and self.segments[i][0] in phases:
                total += stall
        return total

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
    for key in ("batch_start", "proc_start"):  # the batch script's start; else (local) the process's own
        if started is not None and isinstance(started.get(key), (int, float)):
            start = min(start, float(started[key]))
    running = now is not None
    return start, (now if running else max(e["t"] for e in evs)), running


def build(events: list[dict], allocations: list[Allocation] | None = None, *, now: float | None = None,
          vetted: dict[int, float] | None = None, submitted_at: float | None = None,
          span: tuple[float | None, float | None] | None = None, state: str | None = None) -> list[Attempt]:
    """The attempts of one task. ``allocations``: the scheduler's runs, oldest first (none known: the events'
    own span); ``now``: the time, when the newest attempt is still running; ``vetted``: attempt -> when its last
    vetting report was written; ``submitted_at``: the submission (the first attempt's queue time); ``span``: the
    whole job's start and end where no scheduler keeps them (the local profile's process): the first attempt
    begins and the last ends there, and a job with no timeline is one unrecorded attempt over it; ``state``: the
    job's state where no allocation says it (the local profile), the newest attempt's."""
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
            if match is not None and not running:  # sacct's End is cut to the second: the last lines are inside
                last = max(e["t"] for e in by[match])
                end = min(last, end + SCHEDULER_CLOCK_S) if last > end else end
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
        if span is not None:
            first, last = span
            if not spans and first is not None and (last is not None or now is not None):
                spans.append((0, first, last if last is not None else now, last is None, None))
            elif spans:
                n, start, end, running, alloc = spans[0]
                spans[0] = (n, min(start, first) if first is not None else start, end, running, alloc)
                n, start, end, running, alloc = spans[-1]
                if last is not None and not running:
                    spans[-1] = (n, start, max(end, last), running, alloc)

    attempts = []
    for number, start, end, running, alloc in spans:
        evs = by.get(number, [])
        started = next((e for e in evs if e["event"] == "started"), None)
        nodes = alloc.nodes if alloc is not None else _int(started.get("nodes") if started else None) or 1
        hosts = list(alloc.hosts) if alloc else []
        newest = number == spans[-1][0]
        said = alloc.state if alloc else ("RUNNING" if running else ((state or "") if newest else ""))
        runs = _by_run(evs)
        cuts = _run_cuts(runs, start, max(end, start))
        for i, (run, run_events) in enumerate(runs or [(0, [])]):
            last_run = i == len(runs) - 1 or not runs
            a = Attempt(number, cuts[i], cuts[i + 1], nodes, nodes, hosts, said if last_run else "",
                        running and last_run, run=run, restarted=not last_run)
            if alloc is not None and alloc.submit is not None and i == 0:
                a.submitted_at = alloc.submit
            _fill(a, run_events, vetted.get(number) if i == 0 else None, restart=i > 0)
            attempts.append(a)

    for prev, a in zip(attempts, attempts[1:]):
        a.queued_s = 0.0 if a.run > 0 and a.number == prev.number else max(0.0, a.start - prev.end)
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


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _by_run(evs: list[dict]) -> list[tuple[int, list[dict]]]:
    """An attempt's events cut into its runs: a new run begins at each ``started`` line of another rank-0 process
    (torchrun started its worker group again: a lost node, a failed rank, a node joining; its own restart count
    does not change for every one of these). Lines of several nodes are in the order they were written, so an
    exit the old group's survivors noted comes before the new group's start."""
    runs: list[list[dict]] = [[]]
    process = None
    for e in sorted(evs, key=lambda e: e["t"]):
        if e["event"] == "started" and isinstance(e.get("proc_start"), (int, float)):
            if process is not None and e["proc_start"] != process:
                runs.append([])
            process = e["proc_start"]
        runs[-1].append(e)
    return list(enumerate(r for r in runs if r))


def _run_cuts(runs: list[tuple[int, list[dict]]], start: float, end: float) -> list[float]:
    """Where each run's slice of the allocation begins and ends: a run after an elastic restart begins at the
    last sign of life of the one before (its restart time is the next run's)."""
    cuts = [start]
    for (_, before), (_, after) in zip(runs, runs[1:]):
        last, first = max(e["t"] for e in before), min(e["t"] for e in after)
        cuts.append(min(max(last, cuts[-1]), max(first, cuts[-1]), end))
    return cuts + [end]


def _clamp(a: Attempt, t: float | None) -> float | None:
    return None if t is None else min(max(t, a.start), a.end)


def _fill(a: Attempt, evs: list[dict], vetted_at: float | None, restart: bool = False) -> None:
    if not evs:
        a.segments = [("unrecorded", a.start, a.end)] if a.end > a.start else []
        return
    steps = [s for s in (_step(e) for e in evs) if s is not None]
    started = next((e for e in evs if e["event"] == "started"), None)
    resumed = next((e for e in evs if e["event"] == "resumed"), None)
    run_nodes = _int(started.get("run_nodes")) if started else None
    a.used_nodes = run_nodes if run_nodes is not None and run_nodes <= a.nodes else a.nodes
    a.resumed_from = _step(resumed) if resumed else None
    a.step_from = a.resumed_from if a.resumed_from is not None else ((_step(started) or 0) if started else 0)
    a.step_to = max(steps + [a.step_from])
    a.vetted_at = _clamp(a, vetted_at)
    first = {}
    for e in evs:
        first.setdefault(e["event"], e)
    a.training_at = _clamp(a, first["training"]["t"]) if "training" in first else None
    a.first_step_at = _clamp(a, first["progress"]["t"]) if "progress" in first else None
    if started is not None and isinstance(started.get("proc_start"), (int, float)):
        a.proc_start_at = _clamp(a, float(started["proc_start"]))
    if "signal" in first:
        a.signal_at, a.signal = _clamp(a, first["signal"]["t"]), str(first["signal"].get("why", ""))
    stop = first.get("stopped")
    ends = [e for e in evs if e["event"] == "ended"]
    if ends:  # the first exit noted (the survivors of a lost node may note theirs a moment apart)
        a.ended_at = _clamp(a, min(e["t"] for e in ends))
        failed = [e for e in ends if e.get("how") == "exception"]
        a.ended_how = "exception" if failed else "exit"
        a.error = str(failed[0].get("error") or "an exception") if failed else None
    finished = first.get("finished")
    a.stopped_at = _clamp(a, (stop or finished)["t"]) if (stop or finished) else None
    a.last_at = a.end if a.running else _clamp(a, max(e["t"] for e in evs))
    a.saves = _saves(a, evs)
    _fill_tiers(a, evs, started, resumed)
    a.hangs = [{"t": _clamp(a, e["t"]), "step": _step(e), "idle_s": float(e.get("idle_s") or 0.0)}
               for e in evs if e["event"] == "hang"]

    cursor = a.start
    segs: list[tuple[str, float, float]] = []
    if restart:  # the lost run's last sign of life to this run's processes: noticing, the rendezvous' wait
        came = a.proc_start_at if a.proc_start_at is not None else (
            _clamp(a, started["t"]) if started is not None else cursor)
        segs.append(("restart", cursor, max(cursor, came)))
        cursor = max(cursor, came)
    if a.vetted_at is not None and a.vetted_at > cursor:
        segs.append(("vetting", cursor, a.vetted_at))
        cursor = a.vetted_at
    # the run's training ends at its stop; at the last optimizer step of a run that ended by itself (what comes
    # after it, a final evaluation or save and the exit, is its ending); else at the last line (a kill's progress)
    last_step = [e["last_step_t"] for e in evs if e["event"] in ("finished", "ended")
                 and isinstance(e.get("last_step_t"), (int, float))]
    if a.running:
        train_end = a.end
    elif stop:
        train_end = _clamp(a, stop["t"])
    elif last_step:
        train_end = _clamp(a, max(last_step))
    elif finished is not None:
        train_end = _clamp(a, finished["t"])
    else:
        train_end = a.last_at
    if a.training_at is None:
        segs.append(("startup", cursor, max(cursor, train_end)))
    else:
        t = max(cursor, a.training_at)
        segs.append(("startup", cursor, t))
        segs.append(("training", t, max(t, train_end)))
    end_of_run = segs[-1][2]
    if a.end > end_of_run:
        ended_by_itself = stop is None and (a.ended_at is not None or finished is not None)
        segs.append(("ending" if ended_by_itself else "stopping", end_of_run, a.end))
    for s in a.saves:
        segs = _paint(segs, "checkpoint", s["t"] - s["stall_s"], s["t"], only=("training", "startup", "ending"))
    for h in a.hangs:
        segs = _paint(segs, "hang", h["t"] - h["idle_s"], h["t"], only=("training",))
    a.fast_stalls = _fast_stalls(a, evs)
    a.segments = [(n, t0, t1) for n, t0, t1 in segs if t1 > t0]


def _float(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fill_tiers(a: Attempt, evs: list[dict], started: dict | None, resumed: dict | None) -> None:
    """What the checkpoint tiers and the recovery need: the run's nodes, a spare's place, the resume's load and
    tier, when steps ended, the fast tier's totals. Lines of earlier hpc versions lack the newer keys: None."""
    if started is not None:
        a.started_at = _clamp(a, started["t"])
        hosts = started.get("hosts")
        a.run_hosts = [str(h) for h in hosts] if isinstance(hosts, list) else []
        replaced = started.get("replaced")
        a.replaced = {k: str(replaced.get(k)) for k in ("lost", "spare")} if isinstance(replaced, dict) else None
    if resumed is not None:
        a.load_s = _float(resumed.get("load_s"))
        tier, folder = resumed.get("tier"), resumed.get("folder")
        a.resumed_tier = str(tier) if tier is not None else None
        a.resumed_folder = str(folder) if folder is not None else None
    failed = [e["t"] for e in evs if e["event"] == "ended" and e.get("how") == "exception"]
    a.failed_at = _clamp(a, min(failed)) if failed else None
    exits = [_clamp(a, e["last_step_t"]) for e in evs
             if e["event"] in ("finished", "ended") and _float(e.get("last_step_t")) is not None]
    a.exit_step_at = max(exits) if exits else None
    a.step_ends = sorted([_clamp(a, e["t"]) for e in evs if e["event"] == "progress"] + exits)
    fast = [e["fast"] for e in evs if e["event"] == "progress" and isinstance(e.get("fast"), dict)]
    a.fast_commits = [(_clamp(a, e["t"]), _step(e["fast"])) for e in evs if e["event"] == "progress"
                      and isinstance(e.get("fast"), dict) and _step(e["fast"]) is not None]
    if fast:
        last = fast[-1]
        a.fast = {"saves": sum(int(_float(f.get("n")) or 0) for f in fast),
                  "stall_s": sum(_float(f.get("stall_s")) or 0.0 for f in fast),
                  "busy_s": sum(_float(f.get("busy_s")) or 0.0 for f in fast),
                  "step": _step(last), "replicas": last.get("replicas")}


def _fast_stalls(a: Attempt, evs: list[dict]) -> list[tuple[float, float]]:
    """(progress line's time, the fast tier's loop stall summed since the line before): the total is exact; where
    inside that interval each save held the loop is not recorded."""
    out = []
    for e in evs:
        fast = e.get("fast") if e["event"] == "progress" else None
        stall = _float(fast.get("stall_s")) if isinstance(fast, dict) else None
        if stall:
            out.append((_clamp(a, e["t"]), stall))
    return out


def _saves(a: Attempt, evs: list[dict]) -> list[dict]:
    """The saves, each once: a save of a step already saved to the same folder (a stop's save after the script's
    own of that step) wrote nothing and is no save."""
    out, seen = [], set()
    for e in evs:
        if e["event"] != "save":
            continue
        key = (_step(e), e.get("folder"))  # lines of earlier hpc versions name no folder: each is a save
        if key[1] is not None and key in seen:
            continue
        seen.add(key)
        out.append({"t": _clamp(a, e["t"]), "step": _step(e), "stall_s": float(e.get("stall_s") or 0.0),
                    "async": bool(e.get("async")),
                    # the tier it went to ("shared"; None: a line of an earlier hpc, which had the shared tier
                    # only), "node" where it was drained from the fast tier, why the fast tier was passed over
                    "tier": _str(e.get("tier")), "from": _str(e.get("from")), "fallback": _str(e.get("fallback"))})
    return out


def _str(value) -> str | None:
    return str(value) if value is not None else None


def commit_at(a: Attempt, step: int) -> float | None:
    """When the checkpoint of ``step`` the next run resumed from was committed in run ``a``: its save line; a step
    no line names, the run's last one (the fast tier saves every step: it was committed as it ended); else the
    newest commit before it (a save line, the fast tier's step at a progress line). A step before this run's
    work: its first work (all of it was redone)."""
    if a.training_at is None or step <= a.step_from:
        return a.training_at
    exact = [s["t"] for s in a.saves if s["step"] == step]
    if exact:
        return max(exact)
    if step >= a.step_to and a.step_ends:
        return a.step_ends[-1]
    known = [s["t"] for s in a.saves if s["step"] is not None and s["step"] <= step]
    known += [t for t, fast_step in a.fast_commits if fast_step <= step]
    return max(known) if known else a.training_at


def _mark_redone(a: Attempt, resumed_from: int) -> None:
    """The training after the commit of the checkpoint the next attempt resumed from was done in vain."""
    cut = commit_at(a, resumed_from)
    if cut is not None:
        a.segments = _paint(a.segments, "redone", cut, a.end, only=("training",))


def _reason(a: Attempt, last: bool) -> str:
    if a.running:
        return "running"
    said = []
    if a.hangs:
        said.append("hung")
    if a.stopped_at is not None and a.signal:
        said.append(f"stopped at step {a.step_to} on {a.signal}")
    elif a.ended_how == "exception" and a.state != "COMPLETED":
        said.append(f"failed after step {a.step_to}: {a.error}")
    elif a.stopped_at is not None and not last and not a.restarted:
        said.append(f"stopped at step {a.step_to}")
    elif a.stopped_at is not None:
        said.append("work done")
    elif a.ended_how is not None:  # an exception noted in a job the scheduler saw end well: handled, or printed
        said.append(f"ended after step {a.step_to}")
    elif a.last_at is not None and a.training_at is not None:
        said.append(f"{'lost' if a.restarted else 'killed'} after step {a.step_to} (last recorded)")
    if a.restarted:
        said.append("elastic restart")
    elif a.state in REQUEUED_STATES or (not last and a.state not in ("COMPLETED",)):
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
        **checkpoint_totals(attempts),
    }


LOOP_PHASES = ("training", "checkpoint", "redone", "hang")  # the loop's time: what a save's stall is a share of


def checkpoint_totals(attempts: list[Attempt]) -> dict:
    """The saves' cost: the shared tier's (every ``save`` line: earlier hpc versions had that tier only) and the
    fast tier's (the ``progress`` lines' ``fast`` counts), each with the loop's stall, beside the loop's time."""
    saves = [s for a in attempts for s in a.saves]
    fast = [a.fast for a in attempts if a.fast is not None]
    return {
        "saves": len(saves),
        "save_stall_s": sum(s["stall_s"] for s in saves),
        "save_fallbacks": sum(1 for s in saves if s.get("fallback")),
        "fast_saves": sum(f["saves"] for f in fast),
        "fast_stall_s": sum(f["stall_s"] for f in fast),
        "fast_busy_s": sum(f.get("busy_s", 0.0) for f in fast),
        "loop_s": sum(sum(phases[p] for p in LOOP_PHASES) for phases in (a.phase_seconds() for a in attempts)),
    }
