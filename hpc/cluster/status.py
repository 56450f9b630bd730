"""What state a job is in, over all its tasks, and how to wait for it and read its logs."""

from __future__ import annotations

import fnmatch
import sys
import time
from collections import Counter
from typing import Callable, Iterator

from hpc.cluster.records import JobRecord
from hpc.contract import checks, layout
from hpc.errors import HpcError
from hpc.slurm.commands import ControllerDown, TaskState

# the job's state is the first of these that any task is in
_ORDER = ["RUNNING", "COMPLETING", "CONFIGURING", "PENDING", "REQUEUED", "RESIZING", "SUSPENDED", "UNKNOWN",
          "FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT", "PREEMPTED", "CANCELLED", "BOOT_FAIL", "DEADLINE",
          "COMPLETED"]


def states(record: JobRecord) -> dict[str, TaskState]:
    return states_of([record])[record.job_dir]


def states_of(records: list[JobRecord]) -> dict[str, dict[str, TaskState]]:
    """Job folder -> task -> state for many jobs: one scheduler query per backend, not one per job."""
    out: dict[str, dict[str, TaskState]] = {}
    for backend, group in by_backend(records):
        out.update(backend.states(group))
    return out


def by_backend(records: list[JobRecord]) -> list[tuple[object, list[JobRecord]]]:
    """The records grouped by the backend that follows them (a scheduler, or one cluster over SSH)."""
    from hpc.cluster import backends

    groups: dict[int, tuple[object, list[JobRecord]]] = {}
    for record in records:
        backend = backends.for_record(record)
        groups.setdefault(id(backend), (backend, []))[1].append(record)
    return list(groups.values())


def summarize(tasks: dict[str, TaskState]) -> tuple[str, int | None, dict[str, int]]:
    """(the job's state, its exit code, how many tasks are in each state)."""
    counts = Counter(t.state for t in tasks.values())
    overall = min(counts, key=lambda s: _ORDER.index(s) if s in _ORDER else len(_ORDER))
    codes = [t.exit_code for t in tasks.values() if t.exit_code]
    code = codes[0] if codes else (0 if overall == "COMPLETED" else None)
    return overall, code, dict(counts)


def finished(tasks: dict[str, TaskState]) -> bool:
    return all(t.done for t in tasks.values())


def _say(message: str) -> None:
    print(f"hpc: {message}", file=sys.stderr, flush=True)


class Outage:
    """Asks for states through a controller outage: says once that the controller is not answering, then asks
    again with growing pauses (a restart or an upgrade takes minutes; the job runs on meanwhile)."""

    FIRST_PAUSE_S = 1.0
    LONGEST_PAUSE_S = 30.0

    def __init__(self, say: Callable[[str], None] = _say):
        self.say = say
        self.since: float | None = None  # when the controller stopped answering (None: it answers)
        self.message = ""
        self.pause = self.FIRST_PAUSE_S
        self._said = False

    def ask(self, question: Callable[[], dict]) -> dict | None:
        """The answer, or None while the controller does not answer."""
        try:
            answer = question()
        except ControllerDown as down:
            if self.since is None:
                self.since, self.pause = time.monotonic(), self.FIRST_PAUSE_S
            self.message = down.slurm_message
            if not self._said:
                self._said = True
                self.say(f"controller not answering; retrying until it does ({down.slurm_message})")
            return None
        if self.since is not None:
            self.say(f"the controller answers again, after {time.monotonic() - self.since:.0f} s")
            self.since = None
        return answer

    def next_pause(self) -> float:
        pause, self.pause = self.pause, min(self.pause * 2, self.LONGEST_PAUSE_S)
        return pause


def wait(record: JobRecord, timeout: float | None = None, on_poll: Callable[[dict], None] | None = None,
         say: Callable[[str], None] = _say) -> dict[str, TaskState]:
    """Poll until every task has ended. UNKNOWN is not an end: it is asked again, and so is a controller that does
    not answer (said once through ``say``), until ``timeout`` if any."""
    if timeout is not None:  # nan never passes a deadline (a wait for ever), a negative one gave up at once
        try:
            checks.seconds(timeout)
        except HpcError as e:
            raise HpcError(f"timeout = {timeout}: {e.problem}", fix=e.fix) from None
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.25
    outage = Outage(say)
    tasks: dict[str, TaskState] | None = None
    while True:
        now = outage.ask(lambda: states(record))
        if now is not None:
            tasks = now
            if on_poll:
                on_poll(tasks)
            if finished(tasks):
                return tasks
        if deadline is not None and time.monotonic() > deadline:
            if now is None:
                raise TimeoutError(f"job {record.job_id}: the SLURM controller has not answered for "
                                   f"{time.monotonic() - outage.since:.0f} s ({outage.message}); gave up after "
                                   f"{timeout} s")
            raise TimeoutError(f"job {record.job_id} still {summarize(tasks)[0]} after {timeout} s")
        pause = delay if now is not None else outage.next_pause()
        time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
        delay = min(delay * 1.5, 2.0)


def exit_code(tasks: dict[str, TaskState]) -> int:
    """For `hpc wait`: 0 when every task completed, the first task's non-zero code, else 1."""
    overall, code, _ = summarize(tasks)
    if overall == "COMPLETED":
        return 0
    return code if code else 1


def log_files(record: JobRecord, task: str, which: str, rank: int | None = None) -> list[str]:
    """The log files of one task, as paths in the job folder: 'batch', one rank ('rank'), or every file ('all')."""
    from hpc.cluster import backends

    backend = backends.for_record(record)
    tag, folder = backend.log_tag(record, record.task_named(task)), layout.JobFolder
    names = backend.files(record).list(layout.LOGS)
    batch_name = backend.batch_log(record, task)
    batch = [batch_name] if batch_name in names else []
    ranks = (sorted(fnmatch.filter(names, folder.rank_log_name("*", tag)), key=_number)
             or sorted(fnmatch.filter(names, folder.node_log_name("*", tag)), key=_number))
    if which == "batch":
        chosen = batch
    elif which == "rank":
        chosen = [n for n in ranks if _number(n) == (rank or 0)] or (batch if rank in (None, 0) else [])
    else:
        chosen = batch + ranks
    return [f"{layout.LOGS}/{n}" for n in chosen]


def _number(name: str) -> int:
    digits = "".join(c for c in name.split("-", 1)[0] if c.isdigit())
    return int(digits) if digits else 0


def read_logs(record: JobRecord, names: list[str]) -> str:
    from hpc.cluster import backends

    files = backends.for_record(record).files(record)
    return "".join((files.read(n) or b"").decode(errors="replace") for n in names)


def follow(record: JobRecord, names: Callable[[], list[str]], *, keep_going: bool) -> Iterator[tuple[str, str]]:
    """Lines of the files as they grow; with ``keep_going``, until the job has ended (then a last read)."""
    from hpc.cluster import backends

    files = backends.for_record(record).files(record)
    offsets: dict[str, int] = {}
    partial: dict[str, str] = {}

    def drain():
        for name in names():
            data = files.read(name, offsets.get(name, 0))
            if data is None:
                continue
            offsets[name] = offsets.get(name, 0) + len(data)
            text = partial.pop(name, "") + data.decode(errors="replace")
            *lines, rest = text.split("\n")
            if rest:
                partial[name] = rest
            for line in lines:
                yield name, line

    yield from drain()
    outage, ask_at = Outage(), 0.0
    while keep_going:
        done = False
        if time.monotonic() >= ask_at:  # while the controller does not answer, the logs go on growing
            now = outage.ask(lambda: states(record))
            done = now is not None and finished(now)
            ask_at = time.monotonic() + (0.0 if now is not None else outage.next_pause())
        yield from drain()
        if done:
            break
        time.sleep(0.3)
    for name, rest in partial.items():
        yield name, rest
