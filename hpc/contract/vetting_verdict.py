"""The verdict on a job's vetting reports (vetting/<task>/<attempt>/<node>.json, written by
hpc.runtime.vetting.probe): which nodes are bad, which are slow, and which the job starts on. Read in the job by
hpc.runtime.vetting.select and on the login side by `hpc test`. Torch-free.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Verdict:
    host: str
    bad: list[str] = field(default_factory=list)  # reasons the node must not run the job
    slow: list[str] = field(default_factory=list)  # reasons it would hold the job back
    compute: float | None = None
    bandwidth: float | None = None  # its best link, GB/s

    @property
    def fit(self) -> bool:
        return not self.bad and not self.slow


def parse_report(data: bytes | str | None) -> dict | None:
    """A node's report as its file holds it (None: missing, cut short or not a report)."""
    try:
        report = json.loads(data) if data else None
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def read_reports(folder: Path, hosts: list[str]) -> dict[str, dict | None]:
    out: dict[str, dict | None] = {}
    for host in hosts:
        try:
            out[host] = parse_report((folder / f"{host}.json").read_bytes())
        except OSError:
            out[host] = None
    return out


def judge(reports: dict[str, dict | None], relative_speed: float, min_bandwidth: float | None) -> list[Verdict]:
    verdicts = []
    for host, report in reports.items():
        v = Verdict(host)
        if report is None:
            v.bad.append("no vetting report (the node did not run or finish its checks in time)")
        else:
            failed = [c for c in report.get("checks", []) if not c.get("ok")]
            v.bad += [f"{c['name']}: {c.get('detail') or 'failed'}" for c in failed]
            v.compute = report.get("compute_gflops")
            links = report.get("links_gbps") or {}
            v.bandwidth = max(links.values()) if links else None
        verdicts.append(v)
    _mark_slow(verdicts, "compute", "compute {value:.3g} GFLOP/s, {share:.0%} of the median node's", relative_speed)
    _mark_slow(verdicts, "bandwidth", "best link {value:.3g} GB/s, {share:.0%} of the median node's", relative_speed)
    if min_bandwidth:
        for v in verdicts:
            if v.bandwidth is not None and v.bandwidth < min_bandwidth:
                v.slow.append(f"best link {v.bandwidth:.3g} GB/s, below min_bandwidth {min_bandwidth:g}")
    return verdicts


def _mark_slow(verdicts: list[Verdict], attr: str, words: str, relative_speed: float) -> None:
    values = [getattr(v, attr) for v in verdicts if not v.bad and getattr(v, attr)]
    if len(values) < 2:
        return  # one measurement has nothing to be compared with
    median = statistics.median(values)
    for v in verdicts:
        value = getattr(v, attr)
        if not v.bad and value is not None and value < relative_speed * median:
            v.slow.append(words.format(value=value, share=value / median))


def choose(verdicts: list[Verdict], needed: int, held: str | None = None) -> list[Verdict] | None:
    """The ``needed`` nodes to start on, in allocation order: fit ones first (the fastest, if more are fit than
    needed), then slow ones if the job cannot start without them; None when even that is too few. ``held``, the
    node that runs the job script, stays allocated whatever is chosen: when fit it goes first, so that the spare
    given back is another node."""
    usable = [v for v in verdicts if not v.bad]
    if len(usable) < needed:
        return None
    ranked = sorted(usable, key=lambda v: (not v.fit, v.host != held, -(v.compute or 0), -(v.bandwidth or 0)))
    chosen = {id(v) for v in ranked[:needed]}
    return [v for v in verdicts if id(v) in chosen]


def reason(v: Verdict) -> str:
    return "; ".join(v.bad or v.slow)
