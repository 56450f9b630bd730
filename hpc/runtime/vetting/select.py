"""The verdict on the nodes' vetting reports, and the nodes the job starts on. Torch-free: the batch shell runs

    python -m hpc.runtime.vetting.select REPORT_DIR NEEDED HOST...

which prints the NEEDED hosts to start on (allocation order, one per line) and exits 0, or exits 3 when fewer
than NEEDED nodes are fit to run. Either way every node left out is named on stderr and, with its reason, in
tasks/<task>.excluded, which the job script's requeue excludes; a node that is merely slow is used when the job
needs it, named as such.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hpc.contract import layout, runtime_config


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


def read_reports(folder: Path, hosts: list[str]) -> dict[str, dict | None]:
    out: dict[str, dict | None] = {}
    for host in hosts:
        try:
            data = json.loads((folder / f"{host}.json").read_text())
            out[host] = data if isinstance(data, dict) else None
        except (OSError, ValueError):
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


def choose(verdicts: list[Verdict], needed: int) -> list[Verdict] | None:
    """The ``needed`` nodes to start on, in allocation order: fit ones first (the fastest, if more are fit than
    needed), then slow ones if the job cannot start without them; None when even that is too few."""
    usable = [v for v in verdicts if not v.bad]
    if len(usable) < needed:
        return None
    ranked = sorted(usable, key=lambda v: (not v.fit, -(v.compute or 0), -(v.bandwidth or 0)))
    chosen = {id(v) for v in ranked[:needed]}
    return [v for v in verdicts if id(v) in chosen]


def _reason(v: Verdict) -> str:
    return "; ".join(v.bad or v.slow)


def note_excluded(verdicts: list[Verdict]) -> None:
    """Bad nodes, a line each in tasks/<task>.excluded (slow ones are left out only for this attempt)."""
    job_dir = os.environ.get("HPC_JOB_DIR")
    lines = "".join(f"{v.host} vetting: {_reason(v)}\n" for v in verdicts if v.bad)
    if not job_dir or not lines:
        return
    path = layout.JobFolder(job_dir).task(os.environ.get("HPC_TASK", "0"), layout.TaskFile.EXCLUDED)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
    except OSError as e:
        print(f"hpc: vetting: cannot note the excluded nodes in {path}: {e.strerror}", file=sys.stderr)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[1].isdigit():
        print("usage: python -m hpc.runtime.vetting.select REPORT_DIR NEEDED HOST...", file=sys.stderr)
        return 2
    folder, needed, hosts = Path(argv[0]), int(argv[1]), argv[2:]
    config = runtime_config.current_config() or runtime_config.RuntimeConfig()
    verdicts = judge(read_reports(folder, hosts), config.vetting.relative_speed, config.vetting.min_bandwidth)
    chosen = choose(verdicts, needed)
    picked = {v.host for v in chosen or []}
    for v in verdicts:
        if v.bad:
            print(f"hpc: vetting: node {v.host} excluded: {_reason(v)}", file=sys.stderr)
        elif v.slow:
            use = "used: the job needs it" if v.host in picked else "left out"
            print(f"hpc: vetting: node {v.host} is slow ({_reason(v)}); {use}", file=sys.stderr)
    note_excluded(verdicts)
    summary = ", ".join(f"{v.host} {v.compute or 0:.3g} GFLOP/s {v.bandwidth or 0:.3g} GB/s" for v in verdicts)
    if chosen is None:
        print(f"hpc: vetting: {len(verdicts) - sum(bool(v.bad) for v in verdicts)} of {len(hosts)} nodes fit to run,"
              f" {needed} needed ({summary})", file=sys.stderr)
        return 3
    print(f"hpc: vetting: starting on {', '.join(v.host for v in chosen)} ({summary})", file=sys.stderr)
    print("\n".join(v.host for v in chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
