"""Function jobs, the login side: a Python call pickled and signed at submit, results read back and verified.

The job is planned, submitted and recorded like any script (same templates, every profile key, a record that
`hpc status/list/logs/cancel/wait` see); its ranks run hpc.runtime.function_runner. Results are each rank's
``function/result-<rank>.pkl``, ``("success", value)`` or ``("error", traceback)`` as submitit writes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc.contract import layout
from hpc.contract.function_files import CALL_FILE, KEY_FILE, MODULE, new_key, sign, verified  # noqa: F401 - submit's
from hpc.errors import HpcError


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

