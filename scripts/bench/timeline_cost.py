"""What recording the timeline costs a step (docs/benchmarks.md): the per-step check, one event line appended, a
report read back. `python scripts/bench/timeline_cost.py [FOLDER]` (FOLDER: where the job folder would be)."""

import os
import sys
import tempfile
import time

from hpc.contract import goodput, timeline


def per_call(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def main() -> None:
    base = sys.argv[1] if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory(dir=base) as job_dir:
        os.makedirs(f"{job_dir}/tasks")
        os.environ["HPC_JOB_DIR"], os.environ["HPC_TASK"] = job_dir, "0"
        from hpc.runtime.resilience.timeline_writer import TimelineWriter

        w = TimelineWriter(True, every_s=3600)
        w.step_done(0)  # the first line; later calls in the hour only check the clock
        check = per_call(lambda: w.step_done(1), 200_000)
        f = timeline.path(job_dir, "0")
        append = per_call(lambda: timeline.append(f, "save", step=1, stall_s=0.5, **{"async": False}), 2000)
        day = 86400 / timeline.PROGRESS_EVERY_S  # a day's progress lines: the biggest a timeline gets per day
        size = os.path.getsize(f) / 2001
        read = per_call(lambda: goodput.totals(goodput.build(timeline.read(job_dir, "0"), now=time.time())), 20)
        print(f"| per-step check (no line written) | {check * 1e9:.0f} ns |")
        print(f"| one event line appended (O_APPEND) | {append * 1e6:.1f} us |")
        print(f"| progress lines a day (every {timeline.PROGRESS_EVERY_S:g} s) | {day:.0f} lines, "
              f"{day * size / 1024:.0f} KiB, {day * append * 1e3:.0f} ms of appends |")
        print(f"| report arithmetic over 2,000 events | {read * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
