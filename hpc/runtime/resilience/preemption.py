"""Preemption: signals only raise a flag; the ranks agree at a step boundary and stop together.

A handler may run between any two bytecodes (mid all-reduce, mid save), so it does nothing but record
the signal. The batch script also writes the signal's name to HPC_STOP_FILE: ranks whose launcher does
not pass the signal on (torchrun's agent ignores USR1/USR2) still learn of it, at most a second late.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

from hpc.contract import layout
from hpc.contract.atomic import atomic_write
from hpc.errors import HpcError

REQUEUE = 1  # the profile's warning signal (time limit, preemption notice): checkpoint, requeue, exit
STOP = 2  # TERM/INT (scancel, scontrol requeue, preemption, the hard limit): checkpoint and exit; SLURM decides
_CHECK_FILE_EVERY_S = 1.0
_TERM_AGAIN_S = 5.0


class PreemptionWatch:
    def __init__(self, requeue_signals: list[str], stop_file: str | None = None, check_file: bool = True):
        self.requeue_signals = [s.upper().removeprefix("SIG") for s in requeue_signals]
        self.stop_file = Path(stop_file) if stop_file else None
        self.check_file = check_file
        self.received: str | None = None
        self.code = 0
        self._last_check = 0.0
        self._installed: set[str] = set()
        self._term_at = 0.0

    def install(self, term: bool) -> None:
        """The warning signals; with `term`, TERM too. TERM is taken over only once the loop is known to
        check (should_stop): a script that never checks must still die on scancel."""
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        if not self._installed:
            atexit.register(self._ignore_warnings_from_now_on)
        for name in [*self.requeue_signals, *(["TERM"] if term else [])]:
            if name not in self._installed:
                signal.signal(getattr(signal, f"SIG{name}"), self._handle)
                self._installed.add(name)

    def _ignore_warnings_from_now_on(self) -> None:
        # Python restores the default action of handled signals as it shuts down, and USR1's default is to
        # die: a warning that lands while a finished job exits must not turn its success into a failure.
        for name in self.requeue_signals:
            signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name.removeprefix("SIG")
        # asked again, well after the first time: stop waiting for the step boundary. (SLURM signals every
        # process of the step and torchrun's agent forwards the same TERM: one stop often arrives twice.)
        if name == "TERM" and self.code == STOP and time.monotonic() - self._term_at > _TERM_AGAIN_S:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        if name == "TERM" and self.code != STOP:
            self._term_at = time.monotonic()
        self._note(name)

    def _note(self, name: str) -> None:
        code = REQUEUE if name in self.requeue_signals else STOP
        if code > self.code:
            self.code, self.received = code, name

    def local_code(self) -> int:
        """This process's reason to stop (0: none), including a signal the batch script noted in the file."""
        if self.stop_file is not None and self.check_file:
            now = time.monotonic()
            if now - self._last_check >= _CHECK_FILE_EVERY_S:
                self._last_check = now
                try:
                    name = self.stop_file.read_text().strip()
                except OSError:
                    name = ""
                if name:
                    self._note(name)
        return self.code


def requeue_count() -> int:
    """How often this job ran again, whoever requeued it: which attempt this is (SLURM's count, preemptions
    included; the local profile's script keeps its own)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or os.environ.get("HPC_RESTART_COUNT") or 0)


def hpc_requeue_count() -> int:
    """How often hpc itself requeued this task (the warning signal, a hang, a lost node): what max_requeues
    counts. SLURM's own requeues for preemption never count; SLURM_RESTART_COUNT counts them too, so hpc keeps
    its own count in the job folder (tasks/<task>.requeued, written by the job script as it requeues)."""
    path = _task_file(layout.TaskFile.REQUEUED)
    if path is None:  # no job folder to keep a count in (a plain submitit job): SLURM's is all there is
        return requeue_count()
    try:
        return int(path.read_text().split()[0])
    except FileNotFoundError:  # not requeued yet; the local profile's script counts its rounds (all hpc's)
        return int(os.environ.get("HPC_RESTART_COUNT") or 0)
    except (OSError, ValueError, IndexError):
        return 0


def requeue(max_requeues: int | None, why: str) -> tuple[bool, str]:
    """Ask for this job to run again (None: however often it ran); returns whether it will, and what happened
    in words for the log. A refusal is also noted where `hpc status` shows why the job ended."""
    done = hpc_requeue_count()
    if max_requeues is not None and done >= max_requeues:
        return False, note_reason(f"not requeued ({why}): hpc has requeued it {done} times "
                                  f"(max_requeues={max_requeues}; preemptions do not count)")
    if job_script_requeues():  # once the ranks have exited, from outside any container
        Path(os.environ["HPC_REQUEUE_FILE"]).write_text(why + "\n")
        return True, "the job script will requeue it"
    target = _slurm_target()
    if target:  # a submitit function: no script of ours around the ranks, so this rank asks SLURM itself
        from hpc.slurm.commands import Slurm  # only a submitit job's stop needs SLURM's commands: not every start

        try:
            Slurm().requeue(target)
        except HpcError as err:
            return False, note_reason(f"not requeued ({why}): {err}")
        _count_requeue(done + 1)
        return True, f"requeued SLURM job {target}"
    return False, "not requeued: no scheduler and no job script (started by hand)"


def note_reason(reason: str) -> str:
    """Note why the job ends without its work done (tasks/<task>.reason, a line each: `hpc status` shows it);
    returns the reason. Any rank may note the same; a line is appended whole (O_APPEND)."""
    path = _task_file(layout.TaskFile.REASON)
    if path is not None:
        try:
            with open(path, "a") as f:
                f.write(" ".join(reason.split()) + "\n")
        except OSError:
            pass  # the log still says it
    return reason


def _count_requeue(count: int) -> None:
    """hpc's requeue count, written whole: a reader sees the old number or the new one, never half."""
    path = _task_file(layout.TaskFile.REQUEUED)
    if path is None:
        return
    with contextlib.suppress(OSError):
        atomic_write(path, f"{count}\n")


def _task_file(kind: str) -> Path | None:
    path = layout.this_task_file(kind)
    return Path(path) if path else None


def job_script_requeues() -> bool:
    """Whether hpc's job script (SLURM or local) runs around the ranks: it requeues when asked through
    HPC_REQUEUE_FILE, and finds out by itself when SLURM preempted the job."""
    return bool(os.environ.get("HPC_REQUEUE_FILE"))


def preempted_without_job_script() -> bool:
    """Whether SLURM chose this job for preemption (its TERM then means "make room", not "cancel") and no job
    script of hpc's will requeue it (a submitit function): then this process must."""
    target = _slurm_target()
    if not target or job_script_requeues():
        return False
    from hpc.slurm.commands import Slurm  # only a submitit job's stop needs SLURM's commands: not every start

    return Slurm().preempted(target)


def _slurm_target() -> str | None:
    if not os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_EXECUTOR") == "local":
        return None
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]


def log(message: str) -> None:
    print(f"hpc: {message}", file=sys.stderr, flush=True)
