"""`hpc report --html FILE`: the report as one self-contained page (no script, no fetch): a timeline in SVG, one
row per attempt and node, each phase coloured, the queue before each attempt hatched, saves and the stop signal
marked; below it, where the node-seconds went and the attempts in a table. Torch-free; everything the job wrote is
escaped (host names, reasons)."""

from __future__ import annotations

import html
import time

from hpc.cluster.report import attempt_name
from hpc.contract import goodput

COLOURS = {  # phase -> fill; training green, lost time warm, overheads cool: the eye finds the waste
    "training": "#3a9d4a", "startup": "#8fb3d9", "vetting": "#5b7fb5", "checkpoint": "#f2b134",
    "redone": "#d9534f", "hang": "#8e44ad", "restart": "#e07b39", "stopping": "#9aa0a6", "ending": "#c4c9ce",
    "unrecorded": "#d0d0d0",
    goodput.IDLE_SPARES: "#e8d8b0", "queue": "#eeeeee",
}
LABEL_W, ROW_H, WIDTH, TOP = 170, 18, 1100, 34


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _rows(report: dict) -> list[tuple[str, dict, dict, str]]:
    """(label, task, attempt, node) a row each: every attempt on each of its nodes."""
    many = len(report["tasks"]) > 1
    rows = []
    for t in report["tasks"]:
        for a in t["attempts"]:
            hosts = a["hosts"] or [f"node {i + 1}" for i in range(a["nodes"])]
            for i, host in enumerate(hosts):
                spare = i >= a["used_nodes"]
                label = (f"{'task ' + t['task'] + ' ' if many else ''}attempt {attempt_name(a)} {host}"
                         f"{' (spare)' if spare else ''}")
                rows.append((label, t, a, "spare" if spare else host))
    return rows


def svg(report: dict) -> str:
    rows = _rows(report)
    attempts = [a for t in report["tasks"] for a in t["attempts"]]
    if not attempts:
        return '<p>No attempt has started yet.</p>'
    t0 = min(a["start"] - (a["queued_s"] or 0) for a in attempts)
    t1 = max(a["end"] for a in attempts)
    span = max(t1 - t0, 1e-6)
    plot_w = WIDTH - LABEL_W - 10

    def x(t: float) -> float:
        return LABEL_W + (t - t0) / span * plot_w

    height = TOP + ROW_H * len(rows) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11" role="img" '
           f'aria-label="timeline of the job\'s attempts">',
           '<defs><pattern id="queue" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f4f4f4"/>'
           '<line x1="0" y1="0" x2="0" y2="6" stroke="#c8c8c8" stroke-width="2"/></pattern></defs>']
    # the time axis: ticks at round seconds or minutes
    step = next(s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
                if span / s <= 12)
    tick = 0.0
    while tick <= span:
        xt = x(t0 + tick)
        label = f"{tick:.0f}s" if step < 60 else f"{tick / 60:.0f}m"
        out.append(f'<line x1="{xt:.1f}" y1="{TOP - 6}" x2="{xt:.1f}" y2="{height - 24}" stroke="#e4e4e4"/>'
                   f'<text x="{xt:.1f}" y="{TOP - 10}" text-anchor="middle" fill="#555">{label}</text>')
        tick += step
    out.append(f'<text x="4" y="{TOP - 10}" fill="#555">from {_esc(_clock(t0))}</text>')
    for i, (label, task, a, node) in enumerate(rows):
        y = TOP + i * ROW_H
        out.append(f'<text x="4" y="{y + ROW_H - 5}" fill="#222">{_esc(label)}</text>')
        if a["queued_s"]:
            q0 = a["start"] - a["queued_s"]
            out.append(f'<rect x="{x(q0):.1f}" y="{y + 2}" width="{max(x(a["start"]) - x(q0), 0.5):.1f}" '
                       f'height="{ROW_H - 4}" fill="url(#queue)"><title>queued {a["queued_s"]:.1f} s</title></rect>')
        for seg in a["segments"]:
            phase = seg["phase"]
            if node == "spare" and phase != "vetting":
                phase = goodput.IDLE_SPARES
            w = max(x(seg["t1"]) - x(seg["t0"]), 0.5)
            out.append(f'<rect class="phase-{phase}" x="{x(seg["t0"]):.1f}" y="{y + 2}" width="{w:.1f}" '
                       f'height="{ROW_H - 4}" fill="{COLOURS[phase]}"><title>attempt {attempt_name(a)}: {phase} '
                       f'{seg["t1"] - seg["t0"]:.1f} s</title></rect>')
        for s in a["saves"]:
            xs = x(s["t"])
            tier = "".join(f", {k} {_esc(s[k])}" for k in ("tier", "from", "fallback") if s.get(k))
            fill = "#b00020" if s.get("fallback") else "#7a4f00"  # the fast tier was full: the eye should find it
            out.append(f'<path class="mark-save" d="M{xs:.1f} {y} l-3 -0 l3 5 l3 -5 z" fill="{fill}">'
                       f'<title>checkpoint at step {_esc(s["step"])} ({s["stall_s"]:.2f} s{tier})</title></path>')
        if a["signal_at"] is not None:
            xs = x(a["signal_at"])
            out.append(f'<line class="mark-signal" x1="{xs:.1f}" y1="{y}" x2="{xs:.1f}" y2="{y + ROW_H}" '
                       f'stroke="#b00020" stroke-width="2"><title>{_esc(a["signal"])} at '
                       f'{_esc(_clock(a["signal_at"]))}</title></line>')
        if not a["running"] and a is not task["attempts"][-1]:
            xe = x(a["end"])
            out.append(f'<text class="mark-end" x="{xe + 2:.1f}" y="{y + ROW_H - 5}" fill="#b00020">&#x21bb;</text>')
    # the legend
    y = height - 12
    xl = 4.0
    for phase in ("queue", *goodput.PHASES, goodput.IDLE_SPARES):
        fill = "url(#queue)" if phase == "queue" else COLOURS[phase]
        out.append(f'<rect x="{xl:.0f}" y="{y - 9}" width="10" height="10" fill="{fill}" stroke="#999" '
                   f'stroke-width="0.5"/><text x="{xl + 13:.0f}" y="{y}">{phase}</text>')
        xl += 16 + 7 * len(phase) + 8
    out.append(f'<path d="M{xl:.0f} {y - 9} l-3 0 l3 5 l3 -5 z" fill="#7a4f00"/>'
               f'<text x="{xl + 6:.0f}" y="{y}">save</text>')
    xl += 42
    out.append(f'<line x1="{xl:.0f}" y1="{y - 10}" x2="{xl:.0f}" y2="{y + 1}" stroke="#b00020" stroke-width="2"/>'
               f'<text x="{xl + 4:.0f}" y="{y}">stop signal</text><text x="{xl + 80:.0f}" y="{y}" fill="#b00020">'
               f'&#x21bb; requeued</text>')
    out.append("</svg>")
    return "".join(out)


def _attempt_row(t: dict, a: dict) -> str:
    queued = "" if a["queued_s"] is None else f"{a['queued_s']:.0f}"
    good = "" if a["goodput"] is None else f"{100 * a['goodput']:.1f}%"
    fast = a.get("fast") or {}
    cells = [t["task"], attempt_name(a), ", ".join(a["hosts"]) or a["nodes"], queued, f"{a['seconds']:.0f}",
             f"{a['step_from']} to {a['step_to']}", a["redone_steps"], len(a["saves"]), fast.get("saves", ""),
             good, a["reason"]]
    return "<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in cells) + "</tr>"


def _s(value) -> str:
    return "" if value is None else f"{value:.2f}"


def _recovery_row(t: dict, r: dict) -> str:
    name = f"{attempt_name({'attempt': r['after_attempt'], 'run': r['after_run']})} &rarr; {_esc(attempt_name(r))}"
    cells = [_esc(t["task"]), name] + [_esc(c) for c in (
        r["kind"], ", ".join(r["lost"]), r.get("spare") or "", r["detected_by"] or "", r["last_step_from"] or "",
        r["redone_steps"], _s(r["redone_s"]), _s(r["detection_s"]), _s(r["restart_s"]),
        "" if r["queued_s"] is None else f"{r['queued_s']:.0f}", _s(r["startup_s"]), _s(r["load_s"]), r["tier"] or "",
        _s(r["total_s"]))]
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _recoveries(report: dict) -> str:
    rows = "".join(_recovery_row(t, r) for t in report["tasks"] for r in t.get("recoveries", []))
    if not rows:
        return ""
    return ('<h2 style="font-size:15px">Recoveries</h2><p>Seconds, from the commit of the checkpoint the next run '
            'went on from to training again: redone + detection + restart + startup = total '
            '(hpc/contract/recovery.py).</p><table id="recoveries"><tr><th>task</th><th>recovery</th><th>kind</th>'
            '<th>lost</th><th>spare</th><th>noticed by</th><th>last step from</th><th>redone steps</th>'
            '<th>redone</th><th>detection</th><th>restart</th><th>of it queued</th><th>startup</th><th>load</th>'
            f'<th>tier</th><th>total</th></tr>{rows}</table>')


def _checkpoints(tot: dict) -> str:
    loop = tot.get("loop_s") or 0.0
    if not (tot.get("saves") or tot.get("fast_saves")):
        return ""
    share = (lambda v: f"{100 * v / loop:.2f}%") if loop > 0 else (lambda v: "-")
    rows = [("shared", tot["saves"], tot["save_stall_s"]), ("fast", tot.get("fast_saves", 0), tot.get("fast_stall_s",
                                                                                                      0.0))]
    body = "".join(f"<tr><td>{k}</td><td>{n}</td><td>{v:.2f}</td><td>{share(v)}</td></tr>" for k, n, v in rows)
    fallbacks = f"; {tot['save_fallbacks']} shared save(s) because the fast tier was full" \
        if tot.get("save_fallbacks") else ""
    return ('<h2 style="font-size:15px">Checkpoint tiers</h2><table id="tiers"><tr><th>tier</th><th>saves</th>'
            f'<th>loop stalled s</th><th>of the loop\'s {loop:.0f} s</th></tr>{body}</table><p>{fallbacks}</p>')


def page(report: dict) -> str:
    tot = report["totals"]
    alloc = tot["allocated_node_s"]
    pct = (lambda v: f"{100 * v / alloc:.1f}%") if alloc > 0 else (lambda v: "-")
    good = f"{100 * tot['goodput']:.1f}%" if tot["goodput"] is not None else "-"
    parts = "".join(f'<tr><td><span class="sw" style="background:{COLOURS[k]}"></span>{_esc(k)}</td>'
                    f'<td>{v:.1f}</td><td>{pct(v)}</td></tr>' for k, v in tot["node_s"].items() if v > 0)
    attempts = "".join(_attempt_row(t, a) for t in report["tasks"] for a in t["attempts"])
    title = f"hpc report: job {report['job_id']} ({report['name']})"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #222; }}
h1 {{ font-size: 18px; margin: 0 0 4px; }} .sub {{ color: #555; margin-bottom: 12px; }}
.big {{ font-size: 28px; font-weight: bold; color: #3a9d4a; }}
table {{ border-collapse: collapse; margin: 10px 0; font-size: 13px; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; }}
.sw {{ display: inline-block; width: 10px; height: 10px; margin-right: 6px; }}
</style></head><body>
<h1>{_esc(title)}</h1>
<div class="sub">{_esc(report['profile'])} &middot; {_esc(report['state'])} &middot; {tot['attempts']} attempt(s)
 &middot; reported {_esc(time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(report['reported_at'])))}</div>
<div><span class="big" id="goodput">{good}</span> goodput: {tot['productive_node_s']:.0f} of {alloc:.0f} allocated
 node-seconds trained steps that count; {tot['steps_trained']} steps trained, {tot['redone_steps']} redone;
 queued {tot['queued_s']:.0f} s</div>
{svg(report)}
<h2 style="font-size:15px">Where the node-seconds went</h2>
<table><tr><th>phase</th><th>node-seconds</th><th>share</th></tr>{parts}</table>
<h2 style="font-size:15px">Attempts</h2>
<table><tr><th>task</th><th>attempt</th><th>nodes</th><th>queued s</th><th>ran s</th><th>steps</th><th>redone</th>
<th>saves</th><th>fast saves</th><th>goodput</th><th>ended</th></tr>{attempts}</table>
{_recoveries(report)}
{_checkpoints(tot)}
</body></html>
"""
