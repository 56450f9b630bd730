"""The verdict on the nodes' vetting reports, and the nodes the job starts on. Torch-free: the batch shell runs

    python -m hpc.runtime.vetting.select REPORT_DIR NEEDED[+SPARES] HOST...

which prints the NEEDED hosts to start on (allocation order, one per line), then up to SPARES more fit ones (an
elastic job's hot spares: they wait in the job, to replace a node it loses), and exits 0, or exits 3 when fewer
than NEEDED nodes are fit to run. Either way every node left out is named on stderr and, with its reason, in
tasks/<task>.excluded, which the job script's requeue excludes; a node that is merely slow is used when the job
needs it, named as such.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpc.contract import layout, runtime_config
from hpc.contract.atomic import append_whole
from hpc.contract.vetting_verdict import Verdict, choose, judge, read_reports, reason
from hpc.runtime.resilience import notify


def note_excluded(verdicts: list[Verdict]) -> None:
    """Bad nodes, a line each in tasks/<task>.excluded (slow ones are left out only for this attempt)."""
    path = layout.this_task_file(layout.TaskFile.EXCLUDED)
    lines = "".join(f"{v.host} vetting: {reason(v)}\n" for v in verdicts if v.bad)
    if not path or not lines:
        return
    try:
        append_whole(path, lines)
    except OSError as e:
        print(f"hpc: vetting: cannot note the excluded nodes in {path}: {e.strerror}", file=sys.stderr)


def hot_spares(verdicts: list[Verdict], chosen: list[Verdict], count: int) -> list[Verdict]:
    """Up to ``count`` fit nodes beyond the chosen ones, in allocation order: a slow node is never a spare (it
    would slow the job it joins), a bad one never runs."""
    picked = {id(v) for v in chosen}
    return [v for v in verdicts if id(v) not in picked and v.fit][:count]


def main(argv: list[str]) -> int:
    needed_text, _, spares_text = argv[1].partition("+") if len(argv) > 1 else ("", "", "")
    if len(argv) < 3 or not needed_text.isdigit() or not (spares_text or "0").isdigit():
        print("usage: python -m hpc.runtime.vetting.select REPORT_DIR NEEDED[+SPARES] HOST...", file=sys.stderr)
        return 2
    folder, needed, spares, hosts = Path(argv[0]), int(needed_text), int(spares_text or 0), argv[2:]
    config = runtime_config.current_config() or runtime_config.RuntimeConfig()
    verdicts = judge(read_reports(folder, hosts), config.vetting.relative_speed, config.vetting.min_bandwidth)
    # the node this runs on runs the job script: it stays allocated, so it is worth using
    chosen = choose(verdicts, needed, held=os.environ.get("SLURMD_NODENAME"))
    picked = {v.host for v in chosen or []}
    for v in verdicts:
        if v.bad:
            print(f"hpc: vetting: node {v.host} excluded: {reason(v)}", file=sys.stderr)
            notify.send("node_excluded", f"{v.host} left out by vetting: {reason(v)}", key=f"excluded-{v.host}")
        elif v.slow:
            use = "used: the job needs it" if v.host in picked else "left out"
            print(f"hpc: vetting: node {v.host} is slow ({reason(v)}); {use}", file=sys.stderr)
    note_excluded(verdicts)
    summary = ", ".join(f"{v.host} {v.compute or 0:.3g} GFLOP/s {v.bandwidth or 0:.3g} GB/s" for v in verdicts)
    if chosen is None:
        print(f"hpc: vetting: {len(verdicts) - sum(bool(v.bad) for v in verdicts)} of {len(hosts)} nodes fit to run,"
              f" {needed} needed ({summary})", file=sys.stderr)
        return 3
    print(f"hpc: vetting: starting on {', '.join(v.host for v in chosen)} ({summary})", file=sys.stderr)
    waiting = hot_spares(verdicts, chosen, spares)
    if waiting:
        print(f"hpc: vetting: hot spare(s) {', '.join(v.host for v in waiting)}", file=sys.stderr)
    print("\n".join(v.host for v in chosen + waiting))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
