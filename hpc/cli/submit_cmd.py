"""`hpc submit`: render, snapshot, submit, record."""

from __future__ import annotations

import shlex
import sys

import click

from hpc.cli.job_options import JobCommand, job_options, resolve
from hpc.cli.output import echo_json
from hpc.errors import ConfigError, HpcError


def _state_size(ctx, param, value: str | None) -> int | None:
    """--state-size as bytes (SLURM's memory spelling, as --mem: 3G, 512M; a bare number is megabytes)."""
    if value is None:
        return None
    from hpc.slurm import formats

    try:
        return formats.parse_memory(value) * 2**20
    except HpcError as e:
        problem = e.problem.removeprefix(f"memory {value!r} ")  # the flag's name says what it is
        raise ConfigError("command line", "--state-size", value, problem, e.fix) from None


@click.command(cls=JobCommand, epilog="""\b
Examples:
  hpc submit -p slurm-local -N 2 train.py -- --lr 3e-4
  hpc submit --profile local --nproc 2 --wait train.py
  hpc submit -p perlmutter -N 4 --sweep sweep.yaml train.py
  hpc submit -p perlmutter --after 12345 eval.py
  hpc submit -p perlmutter -N 4 --dry-run train.py
  hpc submit -p perlmutter -N 4 --state-size 14G train.py
""")
@job_options
@click.option("--dry-run", is_flag=True, help="Print exactly what would be submitted; submit nothing.")
@click.option("--wait", "wait_", is_flag=True, help="Block until the job ends; exit with its exit code.")
@click.option("--no-snapshot", is_flag=True, help="Run from this folder instead of a copy of the code taken now.")
@click.option("--json", "as_json", is_flag=True, help="Print job_id, job_dir and logs as JSON.")
@click.option("--state-size", metavar="SIZE", callback=_state_size,
              help="Checkpointed state of one rank (weights and optimizer state), e.g. 14G: with the profile's "
                   "fast_tier on, warns before submitting if the tier does not fit the node memory (--mem). "
                   "Default: what the last job of this name and profile measured.")
def submit(profile, job_file, assignments, target, args, flags, dry_run, wait_, no_snapshot, as_json, state_size):
    """Submit a job: a script (train.py), -m MODULE or a command; its own arguments follow `--`."""
    from hpc.cluster import backends, fast_tier_fit, status
    from hpc.cluster.submission import submit as submit_job

    effective = resolve(profile, job_file, assignments, target, args, flags)

    def files_of(record):  # the backend is made only if an earlier job is there to read
        return backends.for_profile(effective.profile).files(record)

    # a warning before anything is submitted; without --state-size, what the last run of this job measured
    fast = fast_tier_fit.check(effective, state_size, files_of)
    fast_json = {"fast_tier": fast} if fast is not None else {}
    result = submit_job(effective, argv=["hpc", *sys.argv[1:]], take_snapshot=not no_snapshot, dry_run=dry_run)
    if dry_run:
        plan = result
        if as_json:
            echo_json({"command": plan.command, "script": plan.script, "hostfile": plan.hostfile,
                       "runtime_config": plan.runtime_config, "job_dir": str(plan.job_dir), "array": plan.array,
                       **fast_json})
            return
        click.echo(f"# would run: {shlex.join(plan.command)}")
        click.echo(plan.script, nl=False)
        if plan.hostfile is not None:
            click.echo(f"# ---- hostfile ({plan.job_dir}/hostfile) ----")
            click.echo(plan.hostfile, nl=False)
        return
    record = result
    if as_json:
        echo_json({"job_id": record.job_id, "job_dir": record.job_dir, "logs": f"{record.job_dir}/logs",
                   "scheduler": record.scheduler, "profile": record.profile,
                   "array": record.array, **fast_json})
    else:
        tasks = f", {len(record.array)} array tasks" if record.array is not None else ""
        click.echo(f"submitted {record.job_id} ({record.profile}{tasks}); logs: {record.job_dir}/logs")
    if wait_:
        from hpc.cli.jobs_cmd import reason_lines, reasons

        tasks = status.wait(record)  # rides out a controller that does not answer for a while
        code = status.exit_code(tasks)
        if not as_json:
            overall = status.summarize(tasks)[0]
            click.echo(f"{record.job_id} {overall} (exit {code})", err=True)
            for line in reason_lines(reasons(tasks), record.array is not None):
                click.echo(line, err=True)
        sys.exit(code)
