"""The embedded default: the job's processes on this machine, followed like a SLURM job."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil

from hpc.executors.base import from_exit_file
from hpc.jobs import JobRecord
from hpc.slurm import formats
from hpc.slurm.commands import TaskState

TIMEOUT_EXIT = 124  # what `timeout` returns when the time limit ends the job


def _start_time(pid: int) -> float | None:
    """When the process started: a pid alone may have been reused."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _session(sid: int) -> list[int]:
    """Every process of the job's session (`timeout` moves itself into a process group of its own)."""
    pids = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid:
                pids.append(pid)
        except OSError:
            continue
    return pids


class LocalExecutor:
    def submit(self, job_dir: str, script: str, workdir: str, time_limit: str) -> tuple[str, dict]:
        job_id = f"local-{os.path.basename(job_dir).rsplit('-', 1)[-1]}{int(time.time()) % 100000}"
        logs = os.path.join(job_dir, "logs")
        tasks = os.path.join(job_dir, "tasks")
        os.makedirs(logs, exist_ok=True)
        os.makedirs(tasks, exist_ok=True)
        seconds = formats.parse_time(time_limit)
        limit = ["timeout", "--signal=TERM", "--kill-after=10", str(seconds)] if seconds else []
        # the wrapper records how the job ended, as a SLURM batch script does for itself
        wrapper = 'rc=0; "$@" || rc=$?; echo "$rc" > "$HPC_TASKS/0.exit"; exit "$rc"'
        env = {**os.environ, "HPC_RANK_LOGS": logs, "HPC_TASKS": tasks, "HPC_JOB_ID": job_id}
        with open(os.path.join(logs, "job-local.out"), "ab") as out:
            proc = subprocess.Popen(["bash", "-c", wrapper, "hpc-local", *limit, "bash", script], cwd=workdir,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        return job_id, {"pid": proc.pid, "start": _start_time(proc.pid)}

    def _alive(self, record: JobRecord) -> bool:
        pid = record.local.get("pid")
        return bool(pid) and _start_time(pid) == record.local.get("start") and not _zombie(pid)

    def states(self, record: JobRecord) -> dict[str, TaskState]:
        if self._alive(record):
            return {"0": TaskState("RUNNING")}
        own = from_exit_file(record, "0")
        if record.marked("cancelled"):
            return {"0": TaskState("CANCELLED", own.exit_code if own else None)}
        if own is not None and own.exit_code == TIMEOUT_EXIT:
            return {"0": TaskState("TIMEOUT", TIMEOUT_EXIT)}
        return {"0": own or TaskState("UNKNOWN", None, "the process is gone and left no exit code")}

    def cancel(self, record: JobRecord, task: str | None = None) -> None:
        record.mark("cancelled")
        if not self._alive(record):
            return
        sid = record.local["pid"]  # started with start_new_session: its pid names the session
        _signal(_session(sid), signal.SIGTERM)  # the job script forwards TERM to its ranks
        deadline = time.monotonic() + 10
        while _session(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal(_session(sid), signal.SIGKILL)


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True
