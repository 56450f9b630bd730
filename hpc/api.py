"""`hpc.submit(...)`: the Python face of `hpc submit`, for scripts and for plain Python functions."""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

from hpc.config import precedence
from hpc.config.precedence import Effective


class Job:
    """A submitted script job: what `hpc status/wait/logs/cancel` do, as methods."""

    def __init__(self, record):
        self.record = record

    @property
    def id(self) -> str:
        return self.record.job_id

    @property
    def job_dir(self) -> Path:
        return self.record.dir

    def states(self) -> dict:
        from hpc import status

        return status.states(self.record)

    def state(self) -> str:
        from hpc import status

        return status.summarize(self.states())[0]

    def wait(self, timeout: float | None = None) -> int:
        """Block until the job ends; returns its exit code (0 when every task completed)."""
        from hpc import status

        return status.exit_code(status.wait(self.record, timeout))

    def logs(self, rank: int | None = 0, task: str | None = None) -> str:
        """One rank's log (rank=None: every log of the task) as text."""
        from hpc import status

        files = status.log_files(self.record, task or self.record.tasks[0], "rank" if rank is not None else "all", rank)
        return "".join(p.read_text(errors="replace") for p in files)

    def cancel(self) -> None:
        from hpc.executors import for_scheduler

        for_scheduler(self.record.scheduler).cancel(self.record)

    def __repr__(self) -> str:
        return f"Job({self.id!r}, {self.record.profile!r}, {str(self.job_dir)!r})"


class FunctionJob:
    """A Python function running through submitit; every task has the standard rendezvous variables."""

    def __init__(self, submitit_job, record=None):
        self.submitit_job, self.record = submitit_job, record

    @property
    def id(self) -> str:
        return str(self.submitit_job.job_id)

    def state(self) -> str:
        return self.submitit_job.state

    def result(self) -> Any:
        """Rank 0's return value (waits for the job)."""
        return self.submitit_job.result()

    def results(self) -> list:
        """Every task's return value, by rank."""
        return self.submitit_job.results()

    def wait(self, timeout: float | None = None) -> int:
        self.submitit_job.wait()
        return 0 if self.submitit_job.state in ("COMPLETED", "FINISHED", "DONE") else 1

    def logs(self) -> str:
        return self.submitit_job.stdout() or ""

    def cancel(self) -> None:
        self.submitit_job.cancel()


class _WithRendezvous:
    """Picklable wrapper: set the rendezvous variables in each task (and the job's runtime settings, as a
    script job has them: preemption, precision, strategy), then call the user's function."""

    def __init__(self, fn: Callable, runtime_config: str | None = None):
        self.fn, self.runtime_config = fn, runtime_config

    def __call__(self, *args, **kwargs):
        import os

        from hpc.render import RUNTIME_CONFIG_ENV
        from hpc.rendezvous import export_from_submitit

        export_from_submitit()
        if self.runtime_config:
            os.environ.setdefault(RUNTIME_CONFIG_ENV, self.runtime_config)
        return self.fn(*args, **kwargs)

    def checkpoint(self, *args, **kwargs):
        """submitit's Checkpointable hook, called when its signal lands before the training loop took the
        signal over (or in a function without an Accelerator): run the same call again after the requeue.
        An Accelerator with auto_resume continues from its newest checkpoint. A function with a checkpoint()
        of its own decides."""
        import submitit

        if callable(getattr(self.fn, "checkpoint", None)):
            again = self.fn.checkpoint(*args, **kwargs)
            if again is not None:
                again.function = _WithRendezvous(again.function, self.runtime_config)
            return again
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _effective(profile: str | None, keys: dict) -> Effective:
    layers = [precedence.env_layer(), precedence.api_layer(keys)]
    return precedence.resolve(profile, layers)


def submit(target: str | Callable, *args: Any, profile: str | None = None, snapshot: bool = True,
           wait: bool = False, **keys: Any) -> Job | FunctionJob:
    """Submit a script (``"train.py"``), a command, or a Python function.

    ``keys`` are job keys as in a job file (nodes=2, nproc_per_node=2, time="00:30:00", ...).
    A function runs once per process, through submitit, with RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR and MASTER_PORT set; ``args`` are its arguments.
    """
    if callable(target):
        job = _submit_function(target, args, profile, keys)
    else:
        from hpc.submission import submit as submit_job

        target = str(target)
        kind = "script" if target.endswith(".py") else "command"
        keys = {**keys, kind: target if kind == "script" else [target]}
        if args:
            keys["args"] = [str(a) for a in args]
        record = submit_job(_effective(profile, keys), argv=[sys.argv[0], "hpc.submit()"], take_snapshot=snapshot)
        job = Job(record)
    if wait:
        job.wait()
    return job


def _submit_function(fn: Callable, args: tuple, profile: str | None, keys: dict) -> FunctionJob:
    import submitit

    from hpc import jobs
    from hpc.render import dependency, gpu_request, runtime_config
    from hpc.slurm import formats

    name = re.sub(r"[^A-Za-z0-9._+-]", "-", getattr(fn, "__name__", "function")).strip("-._+") or "function"
    effective = _effective(profile, {"job_name": name, **keys})
    job, prof = effective.job, effective.profile
    job_dir = jobs.new_job_dir(job.output_dir, job.job_name)
    minutes = math.ceil((formats.parse_time(job.time) or 0) / 60) or 60 * 24 * 365
    if prof.scheduler == "local":
        executor = submitit.LocalExecutor(folder=str(job_dir / "submitit"))
        executor.update_parameters(timeout_min=minutes, nodes=1, tasks_per_node=job.nproc_per_node)
    else:
        executor = submitit.SlurmExecutor(folder=str(job_dir / "submitit"))
        setup = [f"module load {m}" for m in prof.modules] + list(prof.setup)
        env = {**prof.env, **job.env}
        if prof.network_interface:
            env.update(NCCL_SOCKET_IFNAME=prof.network_interface, GLOO_SOCKET_IFNAME=prof.network_interface)
        setup += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
        params: dict[str, Any] = dict(
            job_name=job.job_name, time=minutes, nodes=job.nodes, ntasks_per_node=job.nproc_per_node,
            cpus_per_task=job.cpus_per_task, partition=job.partition, account=job.account, qos=job.qos,
            constraint=job.constraint, mem=job.mem, mem_per_gpu=job.mem_per_gpu, setup=setup,
            signal_delay_s=prof.preemption.lead_time, stderr_to_stdout=True)
        if job.gpus_per_node:
            key, value = gpu_request(job, prof)
            params[key.replace("-", "_")] = value  # submitit's gres / gpus_per_node
        if job.after:
            params["dependency"] = dependency(job)
        executor.update_parameters(**{k: v for k, v in params.items() if v not in (None, [], "")})
    runtime = job_dir / "runtime.json"
    runtime.write_text(json.dumps(runtime_config(effective), indent=2) + "\n")
    return FunctionJob(executor.submit(_WithRendezvous(fn, str(runtime)), *args))
