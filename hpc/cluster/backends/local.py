"""The embedded default: the job's processes on this machine, followed like a SLURM job."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from hpc.cluster.backends.base import (
    Backend,
    LocalFiles,
    Placement,
    Plan,
    explain,
    from_exit_file,
)
from hpc.cluster.records import JobRecord
from hpc.contract import layout
from hpc.errors import HpcError
from hpc.slurm import formats
from hpc.slurm.commands import TaskState

TIMEOUT_EXIT = 124  # what `timeout` returns when the time limit ends the job
LOG_TAG = "local"


class LocalBackend(Backend):
    name = "local"
    script_name = "job.sh"

    def template(self, job) -> str:
        return "local.sh.j2"

    def check(self, job, profile, n_sweep: int) -> None:
        if n_sweep or job.array:
            raise HpcError("sweeps and arrays need a SLURM profile (each task is an array task)",
                           fix="choose a SLURM --profile")
        if job.nodes > 1:
            raise HpcError(f"nodes = {job.nodes}: profile {profile.name} runs on this machine only",
                           fix="use --nodes 1, or a SLURM profile")
        if job.cpu_bind:
            raise HpcError(f"cpu_bind = {job.cpu_bind}: CPU binding is srun's; profile {profile.name} has no srun",
                           fix="drop cpu_bind, or use a SLURM profile")
        if profile.container is not None and profile.container.runtime == "pyxis":
            raise HpcError("the pyxis container needs srun: it cannot run on a local profile",
                           fix="use an apptainer container, or a SLURM profile")

    def template_context(self) -> dict:
        return {"log_tag": LOG_TAG}

    def known_hosts(self, job) -> list[str] | None:
        return ["localhost"]

    def submit_command(self, script: str, workdir: str | None) -> list[str]:
        return ["bash", script]

    def start(self, plan: Plan, placement: Placement) -> tuple[str, dict]:
        job_dir = plan.job_dir
        job_id = f"local-{job_dir.name.rsplit('-', 1)[-1]}{int(time.time()) % 100000}"
        folder = layout.JobFolder(job_dir)
        os.makedirs(folder.logs(), exist_ok=True)
        os.makedirs(folder.tasks(), exist_ok=True)
        seconds = formats.parse_time(plan.effective.job.time)
        limit = ["timeout", "--signal=TERM", "--kill-after=10", str(seconds)] if seconds else []
        # the wrapper records how the job ended, as a SLURM batch script does for itself
        wrapper = 'rc=0; "$@" || rc=$?; echo "$rc" > "$HPC_EXIT_FILE"; exit "$rc"'
        env = {**os.environ, "HPC_RANK_LOGS": folder.logs(), "HPC_JOB_ID": job_id,
               "HPC_EXIT_FILE": folder.task("0", layout.TaskFile.EXIT)}
        with open(os.path.join(folder.logs(), self.batch_log(None, "0")), "ab") as out:
            proc = subprocess.Popen(["bash", "-c", wrapper, "hpc-local", *limit, *plan.command],
                                    cwd=plan.workdir or Path.cwd(), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return job_id, {"pid": proc.pid, "start": _start_time(proc.pid)}

    def states(self, records: list[JobRecord]) -> dict[str, dict[str, TaskState]]:
        return {r.job_dir: {"0": self._state(r)} for r in records}

    def _state(self, record: JobRecord) -> TaskState:
        if _alive(record):
            return TaskState("RUNNING")
        own = from_exit_file(record, "0")
        if record.marked(layout.CANCELLED):
            return TaskState("CANCELLED", own.exit_code if own else None)
        if own is not None and own.exit_code == TIMEOUT_EXIT:
            return TaskState("TIMEOUT", TIMEOUT_EXIT)
        if own is None:
            return TaskState("UNKNOWN", None, "the process is gone and left no exit code")
        return explain(LocalFiles(record.dir), "0", own)  # which rank failed first, as the job script noted it

    def cancel(self, record: JobRecord, task: str | None = None) -> None:
        if task is not None:
            record.task_named(task)  # a local job's one task is the whole job; any other name is refused
        record.mark(layout.CANCELLED)
        if not _alive(record):
            return
        sid = record.local["pid"]  # started with start_new_session: its pid names the session
        _signal(_session(sid), signal.SIGTERM)  # the job script forwards TERM to its ranks
        deadline = time.monotonic() + 10
        while _session(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal(_session(sid), signal.SIGKILL)

    def log_tag(self, record: JobRecord | None, task: str) -> str:
        return LOG_TAG

    def batch_log(self, record: JobRecord | None, task: str) -> str:
        return f"job-{LOG_TAG}.out"


def _start_time(pid: int) -> float | None:
    """When the process started: a pid alone may have been reused."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(record: JobRecord) -> bool:
    pid = record.local.get("pid")
    return bool(pid) and _start_time(pid) == record.local.get("start") and not _zombie(pid)


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
