"""Render, snapshot, submit and record a job: the one path behind `hpc submit` and `hpc.submit()`."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

from hpc import jobs, lead_time, snapshot
from hpc.config.precedence import Effective
from hpc.errors import HpcError
from hpc.render import SbatchRequest, render


@dataclasses.dataclass
class DryRun:
    request: SbatchRequest
    job_dir: Path
    command: list[str]


def _check_script(script: str | None, where: Path, snapshot_taken: bool) -> None:
    """A relative script must exist where the job will run (the snapshot, or this folder)."""
    if not script or not script.endswith(".py") or Path(script).is_absolute():
        return
    if not (where / script).is_file():
        if snapshot_taken:
            raise HpcError(f"script {script!r} is not in the code snapshot (is it ignored by git?)",
                           fix="track it in git, or submit with --no-snapshot")
        raise HpcError(f"script {script!r} not found in {where}", fix="check the path (relative to this folder)")


def submit(effective: Effective, *, argv: list[str], take_snapshot: bool = True, dry_run: bool = False,
           cwd: Path | None = None):
    """Returns a JobRecord, or a DryRun that shows exactly what would be submitted."""
    from hpc.executors import for_scheduler
    from hpc.slurm.commands import Slurm, check_fits, require_conf

    cwd = (cwd or Path.cwd()).resolve()
    job, profile = effective.job, effective.profile
    _check_script(job.script, cwd, snapshot_taken=False)  # fail before anything is written
    if profile.scheduler == "slurm":  # the local profile has no time limit to be warned of
        lead_time.warn_from_history(job.job_name, profile.name, profile.preemption.lead_time)
    if dry_run:
        job_dir = Path(job.output_dir).absolute() / f"{job.job_name}-YYYYmmdd-HHMMSS-xxxx"  # named at submit
        workdir = job_dir / "code" if take_snapshot else cwd
        request = render(effective, job_dir, workdir)
        script = str(job_dir / request.script_name)
        command = (["sbatch", "--parsable", f"--chdir={workdir}", script] if profile.scheduler == "slurm"
                   else ["bash", script])
        return DryRun(request, job_dir, command)
    if profile.scheduler == "slurm":
        require_conf()
        check_fits(Slurm(), job.partition, job.nodes, job.time, job.gpus_per_node)
    job_dir = jobs.new_job_dir(job.output_dir, job.job_name)
    try:
        snap: dict = {"source": "none"}
        workdir = cwd
        if take_snapshot:
            workdir, snap = snapshot.take(cwd, job_dir / "code", exclude_dirs=[Path(job.output_dir).absolute()],
                                          include=job.snapshot_include, exclude=job.snapshot_exclude)
            workdir.mkdir(parents=True, exist_ok=True)
            _check_script(job.script, workdir, snapshot_taken=True)
        request = render(effective, job_dir, workdir)
        request.materialize(job_dir)
        values = {k: {"value": v, "source": s} for k, v, s in effective.explain_rows()}
        (job_dir / "effective.json").write_text(json.dumps(
            {"profile": profile.name, "profile_path": str(effective.profile_path), "values": values}, indent=2) + "\n")
        (job_dir / "logs").mkdir(exist_ok=True)
        job_id, details = for_scheduler(profile.scheduler).submit(
            str(job_dir), str(job_dir / request.script_name), str(workdir), job.time)
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)  # nothing was submitted: leave no half job behind
        raise
    spec = next((d.split("=", 1)[1] for d in request.directives if d.startswith("--array=")), None)
    record = jobs.JobRecord(
        job_id=job_id, scheduler=profile.scheduler, profile=profile.name, name=job.job_name, job_dir=str(job_dir),
        submitted_at=time.time(), argv=argv, workdir=str(workdir), script=request.script_name,
        array=jobs.array_indices(spec) if spec else None, snapshot=snap, local=details)
    jobs.save(record)
    return record
