"""`hpc report`: what happened to a job, attempt by attempt, and where its allocation went (goodput).

Three sources, each read where the job is (over SSH for a remote cluster, through the backend): the scheduler's
runs of each task (`sacct -D`: submit, start, end, nodes of every attempt, a requeued job's included), the
timeline rank 0 wrote (tasks/<task>.timeline: training, saves, the stop), and the vetting reports' times. The
arithmetic is hpc/contract/goodput.py's, shared with the job's own end-of-attempt metrics. A job still running
is reported up to now. Torch-free.
"""

from __future__ import annotations

import time

from hpc.contract import goodput, layout, recovery, timeline
from hpc.slurm import hostlist

VERSION = 1  # of the JSON's shape: keys are only ever added


def _float(value: str) -> float | None:
    try:
        return float(value) if value and value not in ("Unknown", "None") else None
    except ValueError:
        return None


def allocations(rows: list[dict[str, str]], since: float | None) -> list[goodput.Allocation]:
    """sacct's rows of one task -> its runs, oldest first. RESIZING rows (spares given back) are the same run as
    the row after them; rows from before the submission (an older job with the same id) and runs that never
    started are left out."""
    out = []
    for row in rows:
        start = _float(row.get("Start", ""))
        if start is None or row.get("State", "").startswith("RESIZING"):
            continue
        if since is not None and start < since - 5:
            continue
        try:
            hosts = hostlist.expand(row["NodeList"]) if row.get("NodeList") not in (None, "", "None assigned") else []
        except Exception:  # noqa: BLE001 - a host list we cannot read only costs the rows' names
            hosts = []
        nodes = int(row["NNodes"]) if row.get("NNodes", "").isdigit() else max(1, len(hosts))
        end = _float(row.get("End", ""))
        state = row.get("State", "").split()[0] if row.get("State") else ""
        out.append(goodput.Allocation(start, None if state == "RUNNING" else end, nodes, hosts,
                                      _float(row.get("Submit", "")), state))
    out.sort(key=lambda a: a.start)
    return out


def vetting_times(files, task: str) -> dict[int, float]:
    """attempt -> when its last node's vetting report was written (vetting/<task>/<attempt>/<node>.json)."""
    out: dict[int, float] = {}
    mtime = getattr(files, "mtime", None)
    if mtime is None:
        return out
    base = f"{layout.VETTING}/{task}"
    for attempt in files.list(base):
        if not attempt.isdigit():
            continue
        times = [t for t in (mtime(f"{base}/{attempt}/{n}") for n in files.list(f"{base}/{attempt}")
                             if n.endswith(".json")) if t is not None]
        if times:
            out[int(attempt)] = max(times)
    return out


def _raw_ids(files, record) -> dict[str, str]:
    # the jobcomp file knows an array's tasks by their raw ids only; each attempt's batch script wrote its own
    texts = files.read_all(layout.TASKS, f".{layout.TaskFile.JOBID}")
    return {t: text.split()[0] for t, text in texts.items() if text.split()}


def collect(record, backend=None, now: float | None = None) -> dict:
    """The report of a job as a dict (the JSON `hpc report --json` prints)."""
    from hpc.cluster import backends, status

    backend = backend or backends.for_record(record)
    files = backend.files(record)
    now = time.time() if now is None else now
    states = status.states(record)
    rows: dict[str, list[dict[str, str]]] = {}
    slurm = getattr(backend, "slurm", None)
    ids: dict[str, str] = {}
    if slurm is not None:
        source = backend._accounting_source()
        if record.array is None:
            ids = {"0": record.job_id}
        elif source == "dbd":
            ids = {t: f"{record.job_id}_{t}" for t in record.tasks}
        else:
            ids = _raw_ids(files, record)
        if ids:
            rows = slurm.attempts(sorted(set(ids.values())), source)
    since = record.local.get("submitted_on_cluster", record.submitted_at)
    tasks = []
    for task in record.tasks:
        state = states.get(task)
        running = state is not None and state.state == "RUNNING"
        events = timeline.read(record.job_dir, task, files)
        allocs = allocations(rows.get(ids.get(task, ""), []), since)
        attempts = goodput.build(events, allocs, now=now if running else None, vetted=vetting_times(files, task),
                                 submitted_at=since, span=None if slurm is not None else _process_span(record, files),
                                 state=state.state if state is not None and slurm is None else None)
        if not attempts and state is not None and not state.done:
            tasks.append(task_dict(task, state.state, []))
            continue
        tasks.append(task_dict(task, state.state if state else "UNKNOWN", attempts))
    overall, code, _ = status.summarize(states)
    return {"version": VERSION, "job_id": record.job_id, "name": record.name, "profile": record.profile,
            "state": overall, "exit_code": code, "job_dir": record.job_dir, "submitted_at": since,
            "reported_at": now, "tasks": tasks, "totals": summed([t["totals"] for t in tasks])}


def _process_span(record, files) -> tuple[float | None, float | None]:
    """A job no scheduler accounts for (the local profile): its process's start, as recorded at submit, and its
    end, when the wrapper wrote the exit code."""
    start = record.local.get("start")
    mtime = getattr(files, "mtime", None)
    end = mtime(f"{layout.TASKS}/0.{layout.TaskFile.EXIT}") if mtime is not None else None
    return (float(start) if isinstance(start, (int, float)) else None), end


def attempt_name(a: dict) -> str:
    """An attempt as the text and the page name it: its number, and after an elastic restart inside its allocation
    which restart ("0 restart 1")."""
    return f"{a['attempt']} restart {a['run']}" if a.get("run") else str(a["attempt"])


def task_dict(task: str, state: str, attempts: list[goodput.Attempt]) -> dict:
    """One task's part of the report: its attempts, the recoveries between them, its totals."""
    recs = recovery.recoveries(attempts)
    return {"task": task, "state": state, "attempts": [attempt_dict(a) for a in attempts], "recoveries": recs,
            "totals": {**goodput.totals(attempts), **recovery.summary(recs)}}


def attempt_dict(a: goodput.Attempt) -> dict:
    phases, node_s = a.phase_seconds(), a.phase_node_seconds()
    return {
        "attempt": a.number, "run": a.run, "restarted": a.restarted, "state": a.state, "running": a.running,
        "reason": a.reason,
        "nodes": a.nodes, "used_nodes": a.used_nodes, "hosts": a.hosts,
        "submitted_at": a.submitted_at, "queued_s": a.queued_s, "start": a.start, "end": a.end, "seconds": a.seconds,
        "vetted_at": a.vetted_at, "training_at": a.training_at, "first_step_at": a.first_step_at,
        "signal_at": a.signal_at, "signal": a.signal, "stopped_at": a.stopped_at, "last_at": a.last_at,
        "proc_start_at": a.proc_start_at, "ended_at": a.ended_at, "ended_how": a.ended_how, "error": a.error,
        "saves": a.saves, "hangs": a.hangs, "fast": a.fast,
        "started_at": a.started_at, "run_hosts": a.run_hosts, "replaced": a.replaced, "failed_at": a.failed_at,
        "exit_step_at": a.exit_step_at, "load_s": a.load_s, "resumed_tier": a.resumed_tier,
        "resumed_folder": a.resumed_folder,
        "resumed_from": a.resumed_from, "step_from": a.step_from, "step_to": a.step_to,
        "steps_trained": a.steps_trained, "redone_steps": a.redone_steps,
        "phases_s": phases, "node_s": node_s,
        "allocated_node_s": a.allocated_node_s, "productive_node_s": a.productive_node_s,
        "goodput": a.productive_node_s / a.allocated_node_s if a.allocated_node_s > 0 else None,
        "segments": [{"phase": n, "t0": t0, "t1": t1} for n, t0, t1 in a.segments],
    }


SUMMED = ("attempts", "queued_s", "steps_trained", "redone_steps", "saves", "save_stall_s", "save_fallbacks",
          "fast_saves", "fast_stall_s", "fast_busy_s", "loop_s", "recoveries", "recovery_s",
          *(f"recovery_{p}" for p in recovery.PARTS))


def summed(parts: list[dict]) -> dict:
    """Tasks' totals summed: an array's or a sweep's whole cost."""
    node_s = dict.fromkeys((*goodput.PHASES, goodput.IDLE_SPARES), 0.0)
    for p in parts:
        for k, v in p["node_s"].items():
            node_s[k] += v
    allocated = sum(p["allocated_node_s"] for p in parts)
    return {**{k: sum(p.get(k, 0) for p in parts) for k in SUMMED}, "allocated_node_s": allocated,
            "productive_node_s": node_s["training"],
            "goodput": node_s["training"] / allocated if allocated > 0 else None, "node_s": node_s}


# --- text -------------------------------------------------------------------------------------------------
def _clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t is not None else "-"


def _rel(t: float | None, start: float) -> str:
    return f"+{t - start:.1f}s" if t is not None else "-"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def text(report: dict) -> str:
    lines = [f"job {report['job_id']} ({report['name']}, {report['profile']}): {report['state']}"]
    many = len(report["tasks"]) > 1
    for t in report["tasks"]:
        indent = "  " if many else ""
        if many:
            lines.append(f"task {t['task']}: {t['state']}")
        if not t["attempts"]:
            lines.append(f"{indent}no attempt has started yet")
        for a in t["attempts"]:
            s = a["start"]
            hosts = hostlist.compress(a["hosts"]) if a["hosts"] else f"{a['nodes']} node(s)"
            queued = f", queued {a['queued_s']:.0f} s" if a["queued_s"] is not None and not a.get("run") else ""
            lines.append(f"{indent}attempt {attempt_name(a)}: {hosts} ({a['nodes']} node(s)){queued}; "
                         f"{_clock(s)} to {_clock(a['end'])} ({a['seconds']:.0f} s): {a['reason']}")
            marks = [f"processes {_rel(a.get('proc_start_at'), s)}" if a.get("run") and a.get("proc_start_at")
                     else None,
                     f"vetted {_rel(a['vetted_at'], s)}" if a["vetted_at"] else None,
                     f"training {_rel(a['training_at'], s)}" if a["training_at"] else None,
                     f"first step {_rel(a['first_step_at'], s)}" if a["first_step_at"] else None,
                     f"{a['signal']} {_rel(a['signal_at'], s)}" if a["signal_at"] else None,
                     f"run ended {_rel(a['stopped_at'], s)}" if a["stopped_at"] else None,
                     f"exit {_rel(a.get('ended_at'), s)}" if a.get("ended_at") and not a["stopped_at"] else None]
            if any(marks):
                lines.append(f"{indent}  " + ", ".join(m for m in marks if m))
            if a["saves"]:
                stall = sum(x["stall_s"] for x in a["saves"])
                each = ", ".join(f"step {x['step']} {_rel(x['t'], s)} ({x['stall_s']:.2f} s{_tier(x)})"
                                 for x in a["saves"][:6])
                more = f", ... {len(a['saves']) - 6} more" if len(a["saves"]) > 6 else ""
                lines.append(f"{indent}  {len(a['saves'])} save(s), {stall:.2f} s stalled: {each}{more}")
            if a.get("fast"):
                lines.append(f"{indent}  {_fast(a['fast'])}")
            if a["phases_s"].get("unrecorded") and a["training_at"] is None:
                lines.append(f"{indent}  no timeline: its rank 0 ran no hpc Accelerator (or never started), so "
                             "nothing is known of its steps")
                continue
            resumed = f" (resumed from {a['resumed_from']}{_read(a)})" if a["resumed_from"] is not None else ""
            lines.append(f"{indent}  steps {a['step_from']} to {a['step_to']}{resumed}: {a['steps_trained']} trained, "
                         f"{a['redone_steps']} redone later; goodput "
                         f"{_pct(a['productive_node_s'], a['allocated_node_s'])}")
        if t.get("recoveries"):
            lines += [indent + line for line in recovery_table(t["recoveries"])]
    tot = report["totals"]
    alloc = tot["allocated_node_s"]
    lines.append(f"{'all tasks' if many else 'total'}: {tot['attempts']} attempt(s), {alloc:.0f} node-seconds "
                 f"allocated, {tot['productive_node_s']:.0f} productive: "
                 f"goodput {_pct(tot['productive_node_s'], alloc)}; "
                 f"{tot['steps_trained']} steps trained, {tot['redone_steps']} redone")
    rest = [f"{name} {ns:.0f} ({_pct(ns, alloc)})" for name, ns in tot["node_s"].items()
            if name != "training" and ns >= 0.5]
    if rest:
        lines.append("  the rest (node-seconds): " + ", ".join(rest))
    lines.append(f"  queued {tot['queued_s']:.0f} s in all (before and between attempts; not allocated)")
    lines += checkpoint_lines(tot)
    return "\n".join(lines) + "\n"


def _tier(save: dict) -> str:
    """A save's tier as the text says it: ", shared from node", ", shared: fast tier full"; nothing for a line
    of an earlier hpc (the shared tier was its only one)."""
    if not save.get("tier"):
        return ""
    said = f", {save['tier']}" + (f" from {save['from']}" if save.get("from") else "")
    return said + (f" (fallback: {save['fallback']})" if save.get("fallback") else "")


def _read(a: dict) -> str:
    load = f" in {a['load_s']:.2f} s" if a.get("load_s") is not None else ""
    return f", read from the {a['resumed_tier']} tier{load}" if a.get("resumed_tier") else (
        f", loaded{load}" if load else "")


def _replicas(value) -> str:
    if isinstance(value, list):
        return f" on {len(value)} node(s) ({hostlist.compress([str(v) for v in value])})" if value else ""
    return f" on {value} node(s)" if isinstance(value, int) else ""


def _fast(fast: dict) -> str:
    newest = f", newest at step {fast['step']}{_replicas(fast.get('replicas'))}" if fast.get("step") is not None \
        else ""
    busy = f", {fast['busy_s']:.2f} s of writer-thread work beside the loop" if fast.get("busy_s") else ""
    return f"fast tier: {fast['saves']} save(s), {fast['stall_s']:.2f} s stalled{busy}{newest}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def recovery_table(recs: list[dict]) -> list[str]:
    """A row per recovery: its parts, in seconds, adding up to its total (the commit of the checkpoint it went
    on from to training again)."""
    head = ["recovery", "kind", "noticed by", "redone", "detection", "restart", "startup", "load (tier)", "total"]
    rows = [head]
    for r in recs:
        name = (f"{attempt_name({'attempt': r['after_attempt'], 'run': r['after_run']})} -> "
                f"{attempt_name(r)}")
        kind = r["kind"] + (f", {', '.join(r['lost'])} lost" if r["lost"] else "") + (
            f", spare {r['spare']}" if r.get("spare") else "")
        by = (r["detected_by"] or "-") + (" (last step: progress line)" if r["last_step_from"] == "progress line"
                                           else "")
        restart = _s(r["restart_s"]) + (f" (queued {r['queued_s']:.0f})" if r.get("queued_s") else "")
        load = "-" if r["load_s"] is None else f"{r['load_s']:.2f}" + (f" ({r['tier']})" if r["tier"] else "")
        rows.append([name, kind, by, f"{r['redone_steps']} step(s) {_s(r['redone_s'])}", _s(r["detection_s"]),
                     restart, _s(r["startup_s"]), load, _s(r["total_s"])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    out = ["recoveries (seconds, from the commit of the checkpoint resumed from to training again):"]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return out


def checkpoint_lines(tot: dict) -> list[str]:
    """The checkpoints' cost beside the loop's time, each tier's; the recoveries' together."""
    loop = tot.get("loop_s") or 0.0
    out = []
    if tot.get("saves") or tot.get("fast_saves"):
        said = [f"{tot['saves']} save(s) to the shared tier, {tot['save_stall_s']:.2f} s stalled "
                f"({_pct(tot['save_stall_s'], loop)} of the loop's {loop:.0f} s)"]
        if tot.get("save_fallbacks"):
            said.append(f"{tot['save_fallbacks']} of them because the fast tier was full")
        if tot.get("fast_saves"):
            said.append(f"fast tier {tot['fast_saves']} save(s), {tot['fast_stall_s']:.2f} s stalled "
                        f"({_pct(tot['fast_stall_s'], loop)}), its writer thread at work {tot['fast_busy_s']:.2f} s "
                        "beside the loop")
        out.append("  checkpoints: " + "; ".join(said))
    if tot.get("recoveries"):
        parts = ", ".join(f"{p[:-2]} {tot[f'recovery_{p}']:.1f}" for p in recovery.PARTS)
        out.append(f"  recoveries: {tot['recoveries']}, {tot['recovery_s']:.1f} s from checkpoint to training "
                   f"again ({parts})")
    return out
