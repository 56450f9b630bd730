"""Hang watchdog: a rank that completes no step for `hang_timeout` seconds dumps its stacks and ends the job.

torch's own timeouts (30 min for gloo, 10 min for NCCL) end a hung job late and say little about it. Here the
training loop beats (each batch, optimizer step, collective) and a daemon thread looks at the time of the last
beat every min(5, timeout/4) s. Past the timeout the rank dumps the stacks of its threads (py-spy where it is
installed, else faulthandler) into its log, the lowest rank that fired names in one line the ranks stuck outside
a collective (the likely cause) and those only waiting in one for them, and the process ends with
HANG_EXIT_CODE, after before_exit (which may ask for a requeue).

Files in report_dir (the job's folder for this, seen by every node; None: stderr only):
  rank<R>.host   written by start(): the rank's host, so that a rank that never reports is still placed
  rank<R>.stack  the dumped stacks            rank<R>.json  what the rank was doing (written atomically)
  summary.txt    the one-line verdict of the lowest rank that fired

A main thread that holds the GIL forever (a C call that never returns) starves the watchdog thread as well:
then faulthandler's timer, whose C thread never takes the GIL, dumps the stacks to stderr after a grace period
and ends the process with exit code 1 (faulthandler's `_exit(1)`; it cannot be told another code). Its one timer
per process is this module's while a watchdog runs (a program's own dump_traceback_later is replaced), and it
counts time the process spends stopped: a job suspended (scontrol suspend) for longer than the timeout is ended
by it when it resumes.

Only the standard library and hpc.contract (torch-free) are imported: the module must not pull torch in (the
login-node path never does).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from hpc.contract.atomic import atomic_write

# Distinctive, so `hpc status` and a reader of sacct can tell a declared hang: not 0, 1 (a Python error),
# 2 (hpc's user errors, argparse), 124-127 (timeout(1), the shell) or above 128 (128+signal).
HANG_EXIT_CODE = 87

_CHECK_EVERY_MAX_S = 5.0
_CHECK_EVERY_MIN_S = 0.1
_GATHER_MAX_S = 10.0  # how long the lowest rank that fired waits for the others' reports, at most
_POLL_S = 0.2
_PY_SPY_TIMEOUT_S = 15.0
_BEFORE_EXIT_BUDGET_S = 60.0  # before_exit may call scontrol on a busy controller; the backstop allows this much
_CLOCK_SKEW_S = 10.0  # a report written this long before our start() is a previous run's (a requeued job)

# The innermost Python frame of a thread that waits for other ranks: torch.distributed (c10d collectives,
# barriers, FSDP, DTensor), DDP's module code, DeepSpeed's communication layer, hpc's stop vote (should_stop
# waits there for the vote every rank cast).
_COLLECTIVE_PATHS = ("/torch/distributed/", "/torch/nn/parallel/", "/deepspeed/comm/",
                     "/hpc/runtime/process/stop_vote.py", "/hpc/runtime/resilience/join_vote.py")
# DDP and FSDP reduce gradients from autograd hooks and wait for them at the end of backward, inside the C++
# engine: the innermost Python frame is then autograd's.
_BACKWARD_PATHS = ("/torch/autograd/",)
# NCCL collectives return at once on the CPU; a rank waiting for a stuck one blocks at the next
# synchronisation. (One that blocks in `.item()` shows only its own frame, and reads as "not in a collective".)
_WAIT_FUNCTIONS = {"synchronize", "wait", "wait_stream", "barrier"}
_WAIT_PATHS = ("/torch/", "/deepspeed/")

_backstop_owner: HangWatchdog | None = None  # faulthandler has one timer per process: the watchdog that uses it
_fork_hooks_registered = False


class HangWatchdog:
    """Ends this process when it completes no step for `timeout_s` seconds; see the module's doc.

    The training runs in the main thread: that is the thread whose stack decides "in a collective or not".
    """

    def __init__(self, timeout_s: float, rank: int, world_size: int, host: str,
                 report_dir: str | os.PathLike | None, before_exit: Callable[[str], None] | None = None,
                 exit_code: int = HANG_EXIT_CODE, excused: Callable[[], bool] | None = None):
        self.timeout_s = float(timeout_s)
        self.rank, self.world_size, self.host = int(rank), int(world_size), str(host)
        self.report_dir = Path(report_dir) if report_dir is not None else None
        self.before_exit = before_exit
        self.exit_code = exit_code
        # asked before a hang is declared: whether the wait is another rank's known work (rank 0 writing a
        # checkpoint the others do not wait for); the clock then starts again
        self.excused = excused
        # a hang is declared at most a quarter of the timeout late; a check is a few attribute reads, but every
        # 5 s is often enough for any timeout worth setting (minutes)
        self.check_every_s = max(_CHECK_EVERY_MIN_S, min(_CHECK_EVERY_MAX_S, self.timeout_s / 4))
        # the backstop fires this long after the timeout: more than one check later, so that while the watchdog
        # thread can run at all it acts first (and re-arms the backstop for the time its report may take)
        self.backstop_grace_s = 2 * self.check_every_s + 2.0
        self.py_spy: str | None = None  # found by start(); set it to None to dump with faulthandler only
        self.wrote_summary = False  # whether this rank wrote summary.txt (set before before_exit is called)
        self._beat: tuple[float, str] | None = None  # (time.monotonic(), label) of the last beat
        self._pauses = 0
        # held by paused(), stop(), the fork hooks and the thread's decision; never by beat()
        self._lock = threading.RLock()
        self._stopped = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._backstop_at: float | None = None  # when faulthandler's armed timer fires (monotonic); None: not armed
        self._backstop_at_fork: float | None = None
        self._stderr_fd: int | None = None
        self._started_wall = 0.0
        self._declared = False  # a hang is declared: the thread is reporting it and will end the process

    # --- what the training loop calls ----------------------------------------------------------------
    def beat(self, what: str) -> None:
        """Progress. Called for every batch, step and collective: one attribute write, no I/O, no lock."""
        # one tuple, so the thread never pairs one beat's time with another's label (an attribute write is
        # atomic under the GIL)
        self._beat = (time.monotonic(), what)

    @contextlib.contextmanager
    def paused(self, what: str = "pause") -> Iterator[None]:
        """No hang can be declared inside (a checkpoint save or load may take long); a beat on the way out."""
        with self._lock:
            self._pauses += 1
            self._disarm()
        try:
            yield
        finally:
            # the beat before the count drops: the thread must never see "not paused" with the old beat
            self.beat(f"{what} done")
            with self._lock:
                self._pauses -= 1

    def start(self) -> None:
        """Starts the daemon thread (no-op when timeout_s <= 0, or started before). The clock starts at the first
        beat: imports, data loading and compilation before the first step may take long."""
        global _backstop_owner
        with self._lock:
            if self.timeout_s <= 0 or self._thread is not None or self._stopped:
                return
            self._started_wall = time.time()
            self.py_spy = _find_py_spy()
            self._stderr_fd = _stderr_fd()
            if self.report_dir is not None:
                self._prepare_report_dir()
            _register_fork_hooks()
            _install_excepthook()
            _backstop_owner = self
            self._thread = threading.Thread(target=self._run, name="hpc-hang-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """The end of training: the thread ends and nothing fires afterwards."""
        with self._lock:
            self._stopped = True
            self._disarm()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)  # bounded: a thread already reporting a hang ends the process anyway

    # --- the thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        main = threading.main_thread()
        planned = time.monotonic() + self.check_every_s
        while not self._wake.wait(max(0.0, planned - time.monotonic())):
            now = time.monotonic()
            late = now - planned
            if late > max(self.check_every_s, 1.0):
                # woken far later than planned: the process was stopped (scontrol suspend, SIGSTOP, a paused VM)
                # or starved of the GIL, and the main thread could not beat either: that time does not count.
                # (Shifted, not reset: a main thread that hogs the GIL in long stretches is still caught.)
                last = self._beat
                if last is not None:
                    self._beat = (min(now, last[0] + late), last[1])
            planned = now + self.check_every_s
            if not main.is_alive():
                # the script has returned: the interpreter may now take long joining other threads, and nothing
                # trains any more
                with self._lock:
                    self._stopped = True
                    self._disarm()
                return
            with self._lock:
                last = self._beat
                if self._stopped:
                    return
                if self._pauses or last is None:
                    continue
                since = now - last[0]
                if since > self.timeout_s and self.excused is not None and self.excused():
                    self._beat = last = (now, last[1])
                    since = 0.0
                if since <= self.timeout_s:
                    # re-armed here, not in beat(): arming starts a C thread (about 0.1 ms)
                    self._arm(last[0] + self.timeout_s + self.backstop_grace_s - now)
                    continue
                # from here the report itself may hang (py-spy, a dead file system, before_exit): the backstop
                # still ends the process then
                self._arm(_PY_SPY_TIMEOUT_S + 2 * self._gather_s() + self.check_every_s + _BEFORE_EXIT_BUDGET_S)
            self._fire(last[1], since)
            return

    def _arm(self, delay: float) -> None:
        if self._stderr_fd is None or _backstop_owner is not self:
            return
        delay = max(delay, 0.1)
        faulthandler.dump_traceback_later(delay, exit=True, file=self._stderr_fd)
        self._backstop_at = time.monotonic() + delay

    def _disarm(self) -> None:
        if self._backstop_at is not None and _backstop_owner is self:
            faulthandler.cancel_dump_traceback_later()
        self._backstop_at = None

    def _gather_s(self) -> float:
        # ranks fire within about one check of each other (they stall at the same collective)
        return min(_GATHER_MAX_S, 2 * self.check_every_s + 2.0)

    # --- declaring the hang ----------------------------------------------------------------------------
    def _fire(self, label: str, since: float) -> None:
        self._declared = True
        in_collective, where = _main_thread_position(self.world_size)
        stack, dumper = self._dump_stacks()
        me = f"rank {self.rank} on {self.host}"
        main = f"0x{threading.main_thread().ident or 0:016x}"  # faulthandler names threads by this id only
        _log(f"hang: {me}: no step for {since:.0f} s (last beat: {label!r}); the stacks of its threads ({dumper}; "
             f"the main thread is {main}):")
        try:
            sys.stderr.write(stack if stack.endswith("\n") else stack + "\n")
        except (OSError, ValueError):
            pass
        verdict = f"{me} waits in a collective ({where})" if in_collective else \
            f"{me} is not in a collective (at {where})"
        summary = None
        if self.report_dir is not None:
            record = {"rank": self.rank, "host": self.host, "pid": os.getpid(), "last_beat": label,
                      "seconds_since_beat": round(since, 1), "in_collective": in_collective, "where": where,
                      "dumper": dumper, "time": time.time()}
            summary = self._report(record, stack, verdict)
        else:
            _log(f"hang: {verdict}")
        reason = summary or f"hang: no step for {since:.0f} s; {verdict}"
        if self.before_exit is not None:
            try:
                self.before_exit(reason)
            except BaseException as e:  # noqa: BLE001 - the process ends whatever before_exit did
                _log(f"hang: before_exit failed: {e!r}")
        _log(f"hang: ending the process (exit code {self.exit_code})")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # no atexit handlers, no interpreter shutdown: a clean-up that waits on the stuck collective would hang
        # again
        os._exit(self.exit_code)

    def _dump_stacks(self) -> tuple[str, str]:
        """(the stacks of this process's threads, the tool that dumped them)."""
        note = ""
        if self.py_spy:
            try:
                with _ptrace_allowed():
                    done = subprocess.run([self.py_spy, "dump", "--pid", str(os.getpid())], capture_output=True,
                                          text=True, timeout=_PY_SPY_TIMEOUT_S)
                if done.returncode == 0 and done.stdout.strip():
                    return done.stdout, "py-spy"
                said = (done.stderr or done.stdout).strip().replace("\n", " ")[-300:]
                note = f"py-spy failed (exit {done.returncode}: {said}); faulthandler's dump:\n"
            except (OSError, subprocess.SubprocessError) as e:
                note = f"py-spy failed ({e}); faulthandler's dump:\n"
        # faulthandler writes to a file descriptor: a temporary file, so that the same text goes to stderr (which
        # may not be a real file) and to rank<R>.stack
        with tempfile.TemporaryFile() as f:
            faulthandler.dump_traceback(f, all_threads=True)
            f.seek(0)
            return note + f.read().decode(errors="replace"), "faulthandler"

    def _report(self, record: dict, stack: str, verdict: str) -> str | None:
        """Writes this rank's files; the lowest rank that fired gathers the others' and returns the summary."""
        folder = self.report_dir
        assert folder is not None
        summary_path = folder / "summary.txt"
        seen = _mtime(summary_path)  # before our report: a summary newer than this one can count it
        try:
            atomic_write(folder / f"rank{self.rank}.stack", stack)
            atomic_write(folder / f"rank{self.rank}.json", json.dumps(record) + "\n")
        except OSError as e:
            _log(f"hang: {verdict}; cannot write the report to {folder}: {e}")
            return None
        _log(f"hang: {verdict}; stacks in {folder / f'rank{self.rank}.stack'}")
        reports: dict[int, dict] = {}
        deadline = time.monotonic() + self._gather_s()
        while True:
            self._read_reports(reports)
            lower = any(r < self.rank for r in reports)
            if lower or len(reports) >= self.world_size or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        if lower:
            # a lower rank summarizes; wait for it, so that this rank's exit (which may make the launcher kill
            # the others) does not cut it short
            until = time.monotonic() + self._gather_s() + self.check_every_s + 5.0
            while _mtime(summary_path) in (None, seen) and time.monotonic() < until:
                time.sleep(_POLL_S)
            return None
        summary = _summarize(reports, self._hosts(), self.world_size, folder)
        try:
            atomic_write(summary_path, summary + "\n")
        except OSError as e:
            _log(f"hang: cannot write {summary_path}: {e}")
        self.wrote_summary = True
        _log(summary)
        _notify_hang(summary)
        return summary

    def _read_reports(self, reports: dict[int, dict]) -> None:
        """Adds the reports not read yet (one directory listing per poll: a thousand ranks on a shared file system)."""
        try:
            names = os.listdir(self.report_dir)
        except OSError:
            return
        for name in names:
            rank = _rank_of(name, ".json")
            if rank is None or rank in reports:
                continue
            try:
                record = json.loads((self.report_dir / name).read_text())
            except (OSError, ValueError):
                continue  # being replaced, or unreadable: read again at the next poll
            if float(record.get("time", 0)) >= self._started_wall - _CLOCK_SKEW_S:
                reports[rank] = record

    def _hosts(self) -> dict[int, str]:
        hosts = {}
        try:
            names = os.listdir(self.report_dir)
        except OSError:
            return hosts
        for name in names:
            rank = _rank_of(name, ".host")
            if rank is not None:
                with contextlib.suppress(OSError):
                    hosts[rank] = (self.report_dir / name).read_text().strip()
        return hosts

    def _prepare_report_dir(self) -> None:
        folder = self.report_dir
        assert folder is not None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # a requeued job may reuse the folder: this rank's last report is not news
            stale = [f"rank{self.rank}.json", f"rank{self.rank}.stack"] + (["summary.txt"] if self.rank == 0 else [])
            for name in stale:
                with contextlib.suppress(FileNotFoundError):
                    (folder / name).unlink()
            atomic_write(folder / f"rank{self.rank}.host", self.host + "\n")
        except OSError as e:
            _log(f"hang watchdog: cannot use {folder} ({e}); a hang is reported on stderr only")
            self.report_dir = None


# --- helpers -------------------------------------------------------------------------------------------
def _main_thread_position(world_size: int) -> tuple[bool, str]:
    """(whether the main thread waits for other ranks, where it is), from its innermost Python frame.

    Read with sys._current_frames() rather than parsed from the dump: this thread holds the GIL, so the frames
    are exact, whichever tool dumped them.
    """
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return False, "no Python frame"
    code = frame.f_code
    path = code.co_filename.replace(os.sep, "/")
    where = f"{code.co_name} ({os.path.basename(path)}:{frame.f_lineno})"
    if any(p in path for p in _COLLECTIVE_PATHS):
        return True, where
    if world_size > 1 and any(p in path for p in _BACKWARD_PATHS):
        return True, f"{where}, backward: the gradient reduction"
    if code.co_name in _WAIT_FUNCTIONS and any(p in path for p in _WAIT_PATHS):
        return True, where
    return False, where


def _summarize(reports: dict[int, dict], hosts: dict[int, str], world_size: int, folder: Path) -> str:
    """One line: the ranks outside a collective (named one by one: they are the news), those waiting in one,
    and those that said nothing."""
    for rank, record in reports.items():
        hosts.setdefault(rank, record.get("host", "?"))
    stuck = sorted(r for r, rec in reports.items() if not rec.get("in_collective"))
    waiting = sorted(r for r, rec in reports.items() if rec.get("in_collective"))
    silent = [r for r in range(world_size) if r not in reports]
    since = min((float(rec.get("seconds_since_beat", 0)) for rec in reports.values()), default=0.0)
    parts = [f"hang: no step for {since:.0f} s"]
    for rank in stuck[:4]:
        parts.append(f"rank {rank} on {hosts.get(rank, '?')} is not in a collective "
                     f"(at {reports[rank].get('where', '?')}, last beat {reports[rank].get('last_beat')!r}; "
                     f"likely stuck: see {folder / f'rank{rank}.stack'})")
    if stuck[4:]:
        parts.append(f"{_ranks(stuck[4:])} on {_hosts(stuck[4:], hosts)} are not in a collective either")
    if waiting:
        places = {reports[r].get("where") for r in waiting}
        at = f" ({places.pop()})" if len(places) == 1 else ""
        verb = "waits" if len(waiting) == 1 else "wait"
        parts.append(f"{_ranks(waiting)} on {_hosts(waiting, hosts)} {verb} in a collective{at}")
    if silent:
        parts.append(f"{_ranks(silent)} on {_hosts(silent, hosts)} did not report (process frozen or dead, or paused)")
    return "; ".join(parts)


def _ranks(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-2, 5'."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def _hosts(ranks: list[int], hosts: dict[int, str]) -> str:
    names = list(dict.fromkeys(hosts.get(r, "an unknown host") for r in ranks))
    return ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:3])} and {len(names) - 3} more hosts"


def _notify_hang(summary: str) -> None:
    """Tells the user (the job's `notify` target), once per attempt, from the rank that wrote the verdict. Bounded
    (notify gives up after a few seconds, within the backstop's budget for the report) and never raises: the
    process must still end."""
    try:
        from hpc.runtime.resilience import notify

        notify.send("hung", summary, key=f"hung-{notify.attempt()}")
    except Exception as e:  # noqa: BLE001 - a lost notice must not keep a hung process alive
        _log(f"hang: notify failed: {e!r}")


def _rank_of(name: str, suffix: str) -> int | None:
    if not (name.startswith("rank") and name.endswith(suffix)):
        return None
    digits = name[4:-len(suffix)]
    return int(digits) if digits.isdigit() else None


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _find_py_spy() -> str | None:
    # a venv's bin/ is not on PATH when a job runs its python by full path: look beside the interpreter too
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if os.access(beside, os.X_OK) else None)


def _stderr_fd() -> int | None:
    """The descriptor the backstop writes to: the rank's log. None where there is none (then no backstop)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            return stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue
    return None


@contextlib.contextmanager
def _ptrace_allowed() -> Iterator[None]:
    """py-spy reads this process's memory from a child; under Yama's ptrace_scope=1 (Ubuntu's default) a child
    may not trace its parent unless the parent says so. The process ends right after the dump, so allowing
    any tracer for those seconds costs nothing."""
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        scope = "0"
    if scope != "1":
        yield
        return
    import ctypes

    pr_set_ptracer, any_tracer = 0x59616D61, ctypes.c_ulong(-1).value
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_ptracer, ctypes.c_ulong(any_tracer), 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(pr_set_ptracer, ctypes.c_ulong(0), 0, 0, 0)


def _install_excepthook() -> None:
    """Once a hang is declared, an error that ends the main thread meanwhile must not end the process before the
    report does: a peer that reported first and exited breaks this rank's collective ("Connection closed by
    peer"), and the rank would exit 1, its part of the report lost. The main thread then waits for the watchdog
    thread, which ends the process with the hang's exit code. Chained, installed once per process."""
    previous = sys.excepthook
    if getattr(previous, "_hpc_waits_for_a_hang_report", False):
        return

    def hook(kind, value, tb):
        owner = _backstop_owner
        thread = owner._thread if owner is not None else None
        if owner is None or not owner._declared or thread is None or thread is threading.current_thread():
            return previous(kind, value, tb)
        stream = sys.__stderr__ or sys.stderr  # not a buffer that a wrapping hook prints after this one returns
        with contextlib.suppress(Exception):
            stream.write(f"hpc: hang: after it was declared, this rank's main thread ended with {kind.__name__}:\n")
            traceback.print_exception(kind, value, tb, file=stream)
            stream.flush()
        thread.join(timeout=_PY_SPY_TIMEOUT_S + 2 * owner._gather_s() + _BEFORE_EXIT_BUDGET_S + 5.0)

    hook._hpc_waits_for_a_hang_report = True
    sys.excepthook = hook


def _register_fork_hooks() -> None:
    """A child forked while the backstop is armed hangs for ever as its interpreter exits (faulthandler waits
    for a timer thread that was not forked with it). So the timer is cancelled around every os.fork()."""
    global _fork_hooks_registered
    if not _fork_hooks_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                            after_in_child=_after_fork_in_child)
        _fork_hooks_registered = True


def _before_fork() -> None:
    dog = _backstop_owner
    if dog is not None:
        dog._lock.acquire()
        dog._backstop_at_fork = dog._backstop_at
        dog._disarm()


def _after_fork_in_parent() -> None:
    dog = _backstop_owner
    if dog is not None:
        try:
            if dog._backstop_at_fork is not None and not dog._stopped:
                dog._arm(dog._backstop_at_fork - time.monotonic())
        finally:
            dog._backstop_at_fork = None
            dog._lock.release()


def _after_fork_in_child() -> None:
    dog = _backstop_owner
    if dog is not None:
        # the child is not watched (threads do not survive a fork) and the parent's lock was held for the fork
        dog._lock = threading.RLock()
        dog._stopped, dog._backstop_at, dog._backstop_at_fork, dog._thread = True, None, None, None


def _log(message: str) -> None:
    # preemption.log's format; not imported from there, since hpc.runtime's package imports torch
    print(f"hpc: {message}", file=sys.stderr, flush=True)
