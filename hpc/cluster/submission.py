"""Snapshot, plan, submit and record a job: the one path behind `hpc submit` and `hpc.submit()`, for scripts,
commands and Python functions alike."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from hpc.cluster import backends, functions, snapshot
from hpc.cluster import records as jobs
from hpc.cluster.backends import Plan
from hpc.cluster.config.precedence import Effective
from hpc.contract import layout
from hpc.errors import HpcError


def _check_script(script: str | None, where: Path, snapshot_taken: bool) -> None:
    """A relative script must exist where the job will run (the snapshot, or this folder)."""
    if not script or not script.endswith(".py") or Path(script).is_absolute():
        return
    if not (where / script).is_file():
        if snapshot_taken:
            raise HpcError(f"script {script!r} is not in the code snapshot (is it ignored by git?)",
                           fix="track it in git, or submit with --no-snapshot")
        raise HpcError(f"script {script!r} not found in {where}", fix="check the path (relative to this folder)")


def _effective_json(effective: Effective) -> str:
    values = {k: {"value": v, "source": s} for k, v, s in effective.explain_rows()}
    return json.dumps({"profile": effective.profile.name, "profile_path": str(effective.profile_path),
                       "values": values}, indent=2) + "\n"


def _say_left_out(snap: dict) -> None:
    """One line: what the snapshot did not copy (credentials, links out of the project)."""
    left, count = snap.get("left_out") or [], snap.get("left_out_count", 0)
    if count:
        shown = ", ".join(left[:4]) + (", ..." if count > 4 else "")
        print(f"hpc: the code snapshot left out {count} file(s) that look like credentials or lead out of "
              f"the project: {shown}", file=sys.stderr)


def submit(effective: Effective, *, argv: list[str], take_snapshot: bool = True, dry_run: bool = False,
           cwd: Path | None = None, extra_files: dict[str, bytes] | None = None, kind: str | None = None
           ) -> jobs.JobRecord | Plan:
    """Returns the JobRecord; with ``dry_run``, the Plan that would be submitted (its folder not yet named)."""
    cwd = (cwd or Path.cwd()).resolve()
    job, profile = effective.job, effective.profile
    backend = backends.for_profile(profile)
    _check_script(job.script, cwd, snapshot_taken=False)  # fail before anything is written
    backend.advise(effective)
    if dry_run:
        job_dir = backend.placeholder(job)
        return backend.plan(effective, job_dir, job_dir / layout.CODE if take_snapshot else cwd, extra_files)
    if not take_snapshot and backend.needs_snapshot:
        raise HpcError("a remote cluster runs the code snapshot: it cannot run from this folder",
                       fix="drop --no-snapshot")
    backend.preflight(effective)
    # a function job's pickles are signed with a key of its own: the record keeps it, the job gets it in a file
    key = functions.new_key() if kind == "function" else None
    if key is not None and extra_files and functions.CALL_FILE in extra_files:
        extra_files = {**extra_files, functions.CALL_FILE: functions.sign(key, functions.CALL_FILE,
                                                                           extra_files[functions.CALL_FILE])}
    place = backend.new_job(job)
    try:
        snap: dict = {"source": "none"}
        workdir = cwd
        if take_snapshot:
            staged, snap = snapshot.take(cwd, place.stage / layout.CODE, exclude_dirs=[Path(job.output_dir).absolute()],
                                         include=job.snapshot_include, exclude=job.snapshot_exclude)
            staged.mkdir(parents=True, exist_ok=True)
            _check_script(job.script, staged, snapshot_taken=True)
            workdir = place.job_dir / staged.relative_to(place.stage)
            _say_left_out(snap)
        plan = backend.plan(effective, place.job_dir, workdir, extra_files)
        plan.materialize(place.stage)
        if key is not None:
            functions.write_key(place.stage, key)
        (place.stage / layout.EFFECTIVE).write_text(_effective_json(effective))
        (place.stage / layout.LOGS).mkdir(exist_ok=True)
        job_id, details = backend.start(plan, place)
    except BaseException:
        shutil.rmtree(place.stage, ignore_errors=True)  # nothing was submitted: leave no half job behind
        raise
    record = jobs.JobRecord(
        job_id=job_id, scheduler=backend.name, profile=profile.name, name=job.job_name, job_dir=str(place.job_dir),
        submitted_at=time.time(), argv=argv, workdir=str(workdir), script=plan.script_name, array=plan.array,
        snapshot=snap, local=details, kind=kind or ("module" if job.module else "script" if job.script else "command"),
        result_key=key, **backend.record_fields(place))
    jobs.save(record)
    return record
