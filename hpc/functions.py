"""Function jobs: a Python call, pickled at submit, run by every rank of an ordinary hpc job.

The job is planned, submitted and recorded like any script (same templates, every profile key, a record that
`hpc status/list/logs/cancel/wait` see); its program is ``python -m hpc.functions``. The call is a submitit
``DelayedSubmission`` and runs as submitit runs one, so its checkpointing protocol holds: when the warning
signal arrives before an Accelerator has taken it over, rank 0 asks the callable's ``checkpoint()`` (or repeats
the call) for the next attempt and the job script requeues. Results are each rank's
``function/result-<rank>.pkl``, ``("success", value)`` or ``("error", traceback)`` as submitit writes them.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Any, Callable

from hpc import layout

MODULE = "hpc.functions"
CALL_FILE = f"{layout.FUNCTION}/{layout.FUNCTION_CALL}"


def pickle_call(fn: Callable, args: tuple, kwargs: dict) -> bytes:
    import cloudpickle
    from submitit.helpers import DelayedSubmission

    return cloudpickle.dumps(DelayedSubmission(fn, *args, **kwargs))


class FunctionFailed(RuntimeError):
    """A function job's call raised; the message ends with its traceback from the job."""


def read_result(files, rank: int) -> Any:
    """What rank ``rank`` returned (``files``: the job folder, as its backend reads it); raises FunctionFailed
    with the job's traceback if it raised."""
    import pickle

    name = f"{layout.FUNCTION}/{layout.function_result(rank)}"
    data = files.read(name)
    if data is None:
        raise FunctionFailed(f"rank {rank} left no result ({name}): it did not return; see its log")
    outcome, value = pickle.loads(data)
    if outcome != "success":
        raise FunctionFailed(f"rank {rank} raised:\n{value}")
    return value


def result_ranks(files) -> list[int]:
    prefix, suffix = layout.function_result("X").split("X")
    found = (n[len(prefix):-len(suffix)] for n in files.list(layout.FUNCTION)
             if n.startswith(prefix) and n.endswith(suffix))
    return sorted(int(r) for r in found if r.isdigit())


class _WarningSignal(BaseException):
    """Unwinds the call when the warning signal lands (BaseException: a user's `except Exception` lets it by)."""


def _save(path: str, obj: Any) -> None:
    import cloudpickle

    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        cloudpickle.dump(obj, f)
    os.replace(tmp, path)  # a reader never sees half a pickle


def _next_attempt(delayed):
    """What the requeued job runs: the callable's own checkpoint(), else the same call again."""
    from submitit.helpers import DelayedSubmission

    again = delayed._checkpoint_function()
    return again if again is not None else DelayedSubmission(delayed.function, *delayed.args, **delayed.kwargs)


def main() -> int:
    from submitit.helpers import DelayedSubmission

    from hpc import runtime_config

    folder = layout.JobFolder(os.environ["HPC_JOB_DIR"])
    config = runtime_config.current()
    warning = config.get("preemption", {}).get("signal", "USR1")
    rank = int(os.environ.get("RANK", "0"))
    call_path = folder.function(layout.FUNCTION_CALL)
    delayed = DelayedSubmission.load(call_path)

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
        from hpc.runtime import preemption  # torch comes with it: only on this path

        _save(call_path, _next_attempt(delayed))
        limit = int(config.get("preemption", {}).get("max_requeues", 3))
        requeued, said = preemption.requeue(limit, f"{stop} before the call took the signal over")
        preemption.log(f"function stopped by {stop}; {said}")
        return 0 if requeued else 128 + getattr(signal, f"SIG{stop}")
    except Exception:
        outcome = ("error", traceback.format_exc())
    _save(folder.function(layout.function_result(rank)), outcome)
    if outcome[0] == "error":
        print(outcome[1], file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
