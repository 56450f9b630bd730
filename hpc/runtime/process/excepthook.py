"""In a training process, an HpcError that nobody catches is one line and exit code 2, as on the command line.

Without this every rank prints the same 10-line traceback for a refused setting. The line names the rank
(``[rank 1] hpc: error: ...``) because all ranks' output meets in one terminal or log. Any other exception keeps
Python's traceback; HPC_TRACEBACK=1 shows it for an HpcError too.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

from hpc.errors import EXIT_USER_ERROR, HpcError, one_line


def install() -> None:
    """Make uncaught HpcErrors one line; idempotent, and any hook already installed still gets the rest."""
    if getattr(sys.excepthook, "_hpc_one_line", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, HpcError) or os.environ.get("HPC_TRACEBACK"):
            return previous(kind, value, tb)
        rank = os.environ.get("RANK")
        prefix = f"[rank {rank}] " if rank is not None else ""
        # the process's own stderr: torch's process group wraps this hook in one that sends sys.stderr to a
        # buffer it prints after the hook returns, and this one does not return
        stream = sys.__stderr__ or sys.stderr
        stream.write(f"{prefix}hpc: error: {one_line(str(value))}\n")
        _exit(EXIT_USER_ERROR)

    hook._hpc_one_line = True
    sys.excepthook = hook


def _exit(code: int) -> None:
    """Finish as Python does after an uncaught exception (wait for non-daemon threads, run atexit), but with
    ``code``: past an excepthook, Python itself would always exit 1."""
    finish()
    os._exit(code)


def finish() -> None:
    """What the interpreter does before it exits: wait for non-daemon threads, run atexit, flush the streams."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s}.values():
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe nobody reads any more
            pass
