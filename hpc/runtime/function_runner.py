"""`python -m hpc.runtime.function_runner`: what every rank of a function job runs.

It loads the call hpc pickled at submit (a submitit ``DelayedSubmission``), after checking the job's key and the
call's signature, and runs it as submitit runs one, so its checkpointing protocol holds: when the warning signal
arrives before an Accelerator has taken it over, rank 0 asks the callable's ``checkpoint()`` (or repeats the call)
for the next attempt and the job script requeues. Each rank's ``function/result-<rank>.pkl`` is
``("success", value)`` or ``("error", traceback)``, signed, as hpc.cluster.functions reads it back.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Any

from hpc.contract import layout, runtime_config
from hpc.contract.atomic import atomic_write
from hpc.contract.function_files import CALL_FILE, KEY_FILE, sign, verified


class _WarningSignal(BaseException):
    """Unwinds the call when the warning signal lands (BaseException: a user's `except Exception` lets it by)."""


def _save(path: str, obj: Any, key: str, name: str) -> None:
    import cloudpickle

    atomic_write(path, sign(key, name, cloudpickle.dumps(obj)), mode=0o600)  # a reader never sees half a pickle


class _Refused(Exception):
    """The job's key or call cannot be trusted: the call is not run."""


def _job_key(folder: layout.JobFolder) -> str:
    """The key hpc left for this job: a file of this user's that no one else can read."""
    path = f"{folder.root}/{KEY_FILE}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise _Refused(f"cannot open the job's key {path}: {e.strerror}") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise _Refused(f"the job's key {path} is not this user's alone (uid {st.st_uid}, mode "
                           f"{st.st_mode & 0o777:o})")
        key = f.read().strip()
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise _Refused(f"the job's key {path} is not 64 hex digits")
    return key


def _load_call(path: str, key: str):
    import pickle

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise _Refused(f"cannot open the call {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        payload = verified(key, CALL_FILE, f.read())
    if payload is None:
        raise _Refused(f"the call {path} is not signed with the job's key")
    delayed = pickle.loads(payload)
    if type(delayed).__name__ != "DelayedSubmission":
        raise _Refused(f"the call {path} holds a {type(delayed).__name__}, not a DelayedSubmission")
    return delayed


def _next_attempt(delayed):
    """What the requeued job runs: the callable's own checkpoint(), else the same call again."""
    from submitit.helpers import DelayedSubmission

    again = delayed._checkpoint_function()
    return again if again is not None else DelayedSubmission(delayed.function, *delayed.args, **delayed.kwargs)


def main() -> int:
    folder = layout.JobFolder(os.environ["HPC_JOB_DIR"])
    call_path = folder.function(layout.FUNCTION_CALL)
    try:
        key = _job_key(folder)
        delayed = _load_call(call_path, key)
    except _Refused as e:
        print(f"hpc: {e}: the call is not run", file=sys.stderr, flush=True)
        return 2
    config = runtime_config.current_config() or runtime_config.RuntimeConfig()  # outside hpc: the defaults
    warning = config.preemption.signal
    rank = int(os.environ.get("RANK", "0"))

    def on_warning(signum, frame):
        raise _WarningSignal(signal.Signals(signum).name.removeprefix("SIG"))

    for name in dict.fromkeys([warning, "USR2"]):  # USR2: submitit's own warning, for code written for it
        if name not in ("TERM", "INT"):
            signal.signal(getattr(signal, f"SIG{name}"), on_warning)
    try:
        outcome = ("success", delayed.result())
    except _WarningSignal as stop:
        if rank != 0:
            return 0
        from hpc.runtime.resilience import preemption  # torch comes with it: only on this path

        _save(call_path, _next_attempt(delayed), key, CALL_FILE)
        limit = config.preemption.max_requeues
        requeued, said = preemption.requeue(limit, f"{stop} before the call took the signal over")
        preemption.log(f"function stopped by {stop}; {said}")
        return 0 if requeued else 128 + getattr(signal, f"SIG{stop}")
    except Exception:  # noqa: BLE001 - whatever the call raised goes back to the caller, as submitit does
        outcome = ("error", traceback.format_exc())
    result = layout.function_result(rank)
    _save(folder.function(result), outcome, key, f"{layout.FUNCTION}/{result}")
    if outcome[0] == "error":
        print(outcome[1], file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
