"""`hpc render`: the job's batch script and hostfile, printed or written to a folder."""

from __future__ import annotations

from pathlib import Path

import click

from hpc.cli.job_options import JobCommand, job_options, resolve
from hpc.cli.output import echo_json, table


@click.command(cls=JobCommand, epilog="""\b
Examples:
  hpc render -p slurm-local -N 2 train.py -- --lr 3e-4
  hpc render -p perlmutter -N 4 --launcher torchrun -o job/ train.py
  hpc render -p juwels-booster --explain -m mypkg.train
""")
@job_options
@click.option("-o", "--out", "out", type=click.Path(file_okay=False),
              help="Write the files into this folder instead of printing.")
@click.option("--explain", is_flag=True, help="Show every effective value and where it came from.")
@click.option("--json", "as_json", is_flag=True, help="Print script, hostfile and effective values as JSON.")
def render(profile, job_file, assignments, target, args, flags, out, explain, as_json):
    """Render the batch script (and hostfile) of a job without submitting it.

    TARGET is a script (train.py) or a command; the script's own arguments follow `--`.
    """
    from hpc.cluster import backends

    effective = resolve(profile, job_file, assignments, target, args, flags)
    if explain and not as_json:
        click.echo(f"profile: {effective.profile.name} ({effective.profile_path})")
        click.echo(table(["key", "value", "source"], effective.explain_rows()))
        return
    job_dir = Path(out) if out else Path(effective.job.output_dir) / effective.job.job_name
    request = backends.for_profile(effective.profile).plan(effective, job_dir)
    if as_json:
        echo_json({
            "profile": effective.profile.name,
            "template": request.template,
            "script": request.script,
            "hostfile": request.hostfile,
            "runtime_config": request.runtime_config,
            "effective": {k: {"value": v, "source": s} for k, v, s in effective.explain_rows()},
        })
        return
    if out:
        for path in request.materialize():
            click.echo(str(path))
        return
    click.echo(request.script, nl=False)
    if request.hostfile is not None:
        click.echo(f"# ---- hostfile ({request.job_dir}/hostfile) ----")
        click.echo(request.hostfile, nl=False)
