from __future__ import annotations

from hpc.executors.base import from_exit_file
from hpc.jobs import JobRecord
from hpc.slurm.commands import Slurm, TaskState, require_conf


class SlurmExecutor:
    def __init__(self, slurm: Slurm | None = None):
        self.slurm = slurm or Slurm()

    def submit(self, job_dir: str, script: str, workdir: str, time_limit: str) -> tuple[str, dict]:
        require_conf()
        return self.slurm.submit(script, workdir), {}

    def states(self, record: JobRecord) -> dict[str, TaskState]:
        require_conf()
        live = self.slurm.queue(record.job_id)
        out: dict[str, TaskState] = {}
        for task in record.tasks:
            if task in live:
                state, _, reason = live[task]
                out[task] = TaskState(state, None, reason)
                continue
            out[task] = self._finished(record, task)
        return out

    def _finished(self, record: JobRecord, task: str) -> TaskState:
        """squeue forgot it: accounting first, then the job's own record; never assume COMPLETED."""
        raw = record.job_id if record.array is None else None
        try:
            raw = (record.dir / "tasks" / f"{task}.jobid").read_text().split()[0]
        except (OSError, IndexError):
            pass
        if raw:
            acct = self.slurm.accounting(raw, since=record.submitted_at)
            if acct is not None:
                if acct.exit_code is None or acct.state != "FAILED":
                    return acct
                own = from_exit_file(record, task)  # the script's own code beats SLURM's 0:0 on signals
                return TaskState(acct.state, own.exit_code if own else acct.exit_code)
        own = from_exit_file(record, task)
        if own is not None:
            return own
        if record.marked("cancelled"):
            return TaskState("CANCELLED")
        return TaskState("UNKNOWN", None, "not in squeue, accounting or the job's own record")

    def cancel(self, record: JobRecord, task: str | None = None) -> None:
        require_conf()
        record.mark("cancelled")
        self.slurm.cancel(record.job_id if task is None else f"{record.job_id}_{task}")
