"""Function jobs: a Python call, pickled at submit, run by every rank of an ordinary hpc job.

The job is planned, submitted and recorded like any script (same templates, every profile key, a record that
`hpc status/list/logs/cancel/wait` see); its program is ``python -m hpc.cluster.functions``. The call is a submitit
``DelayedSubmission`` and runs as submitit runs one, so its checkpointing protocol holds: when the warning
signal arrives before an Accelerator has taken it over, rank 0 asks the callable's ``checkpoint()`` (or repeats
the call) for the next attempt and the job script requeues. Results are each rank's
``function/result-<rank>.pkl``, ``("success", value)`` or ``("error", traceback)`` as submitit writes them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc.contract import layout
from hpc.errors import HpcError

MODULE = "hpc.cluster.functions"
CALL_FILE = f"{layout.FUNCTION}/{layout.FUNCTION_CALL}"
KEY_FILE = f"{layout.FUNCTION}/{layout.FUNCTION_KEY}"
SIGNED = b"hpc-hmac-sha256 "  # the first line of every pickle of a function job: this, the MAC in hex


def new_key() -> str:
    return secrets.token_hex(32)


def sign(key: str, name: str, payload: bytes) -> bytes:
    """``payload`` (a pickle) as the file ``name`` (relative to the job folder) holds it, signed: a signed file
    copied under another name (rank 1's result as rank 0's, a result as the call) does not verify."""
    return SIGNED + _mac(key, name, payload).encode() + b"\n" + payload


def verified(key: str, name: str, data: bytes) -> bytes | None:
    """The pickle in ``data`` if ``key`` signed it as ``name``; None if unsigned or signed otherwise."""
    head, _, payload = data.partition(b"\n")
    if not head.startswith(SIGNED):
        return None
    ok = hmac.compare_digest(head[len(SIGNED):], _mac(key, name, payload).encode())
    return payload if ok else None


def _mac(key: str, name: str, payload: bytes) -> str:
    return hmac.new(bytes.fromhex(key), name.encode() + b"\0" + payload, hashlib.sha256).hexdigest()


def write_key(job_dir: Path, key: str) -> None:
    """The key the job signs with, in its folder, readable by this user only (and never through a link)."""
    path = Path(job_dir) / KEY_FILE
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")


def pickle_call(fn: Callable, args: tuple, kwargs: dict) -> bytes:
    import cloudpickle
    from submitit.helpers import DelayedSubmission

    return cloudpickle.dumps(DelayedSubmission(fn, *args, **kwargs))


class FunctionFailed(RuntimeError):
    """A function job's call raised; the message ends with its traceback from the job."""


def read_result(files, rank: int, key: str | None = None) -> Any:
    """What rank ``rank`` returned (``files``: the job folder, as its backend reads it; ``key``: the record's
    result_key); raises FunctionFailed with the job's traceback if it raised, HpcError if the result is not
    this user's or not signed by the job."""
    import pickle

    name = f"{layout.FUNCTION}/{layout.function_result(rank)}"
    key = key or getattr(files, "result_key", None) or _record_key(files)
    data = _read_own(files, name)
    if data is None:
        raise FunctionFailed(f"rank {rank} left no result ({name}): it did not return; see its log")
    if key is None:
        raise HpcError(f"the job's record has no result key, so its result {name} cannot be checked: refused",
                       fix="submit the function again (an older hpc submitted it)")
    payload = verified(key, name, data)
    if payload is None:
        raise HpcError(f"the result {name} of rank {rank} is not signed by the job: refused (unpickling it "
                       "could run anyone's code)", fix="check who can write the job folder; submit again")
    outcome, value = pickle.loads(payload)
    if outcome != "success":
        raise FunctionFailed(f"rank {rank} raised:\n{value}")
    return value


def _record_key(files) -> str | None:
    """A job folder on this machine holds its record, and with it the key (read only if it is this user's)."""
    from hpc.cluster import records as jobs

    root = getattr(files, "root", None)
    return jobs.load_dir(Path(root)).result_key if root is not None else None


def _read_own(files, name: str) -> bytes | None:
    """A file of the job folder, refused unless this user owns it; a link is never followed."""
    owned = getattr(files, "read_owned", None)
    if owned is not None:  # a remote job folder: checked there
        return owned(name)
    path = Path(files.root) / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise HpcError(f"cannot read {path}: {e.strerror} (a symlink?): refused", fix="check the job folder") from None
    with os.fdopen(fd, "rb") as f:
        owner = os.fstat(f.fileno()).st_uid
        if owner != os.geteuid():
            raise HpcError(f"{path} belongs to uid {owner}, not to you: refused", fix="check who can write the job "
                           "folder")
        return f.read()


def result_ranks(files) -> list[int]:
    prefix, suffix = layout.function_result("X").split("X")
    found = (n[len(prefix):-len(suffix)] for n in files.list(layout.FUNCTION)
             if n.startswith(prefix) and n.endswith(suffix))
    return sorted(int(r) for r in found if r.isdigit())


class _WarningSignal(BaseException):
    """Unwinds the call when the warning signal lands (BaseException: a user's `except Exception` lets it by)."""


def _save(path: str, obj: Any, key: str, name: str) -> None:
    import cloudpickle

    tmp = f"{path}.tmp{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(sign(key, name, cloudpickle.dumps(obj)))
    os.replace(tmp, path)  # a reader never sees half a pickle


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
    from hpc.contract import runtime_config

    folder = layout.JobFolder(os.environ["HPC_JOB_DIR"])
    call_path = folder.function(layout.FUNCTION_CALL)
    try:
        key = _job_key(folder)
        delayed = _load_call(call_path, key)
    except _Refused as e:
        print(f"hpc: {e}: the call is not run", file=sys.stderr, flush=True)
        return 2
    config = runtime_config.current()
    warning = config.get("preemption", {}).get("signal", "USR1")
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
        limit = int(config.get("preemption", {}).get("max_requeues", 3))
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
