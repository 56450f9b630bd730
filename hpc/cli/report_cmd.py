"""`hpc report JOB`: each attempt's times, the steps trained and redone, and the goodput (text, --json, --html)."""

from __future__ import annotations

import click

from hpc.cli.output import echo_json


@click.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (keys documented in docs/jobs.md).")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, writable=True),
              help="Also write a self-contained page with the timeline drawn (SVG) to this file.")
def report(job, as_json, html_file):
    """What happened to JOB (default: the latest): each attempt's queue, start-up, vetting, saves, stop and end;
    the steps trained and redone; allocated node-seconds, goodput, and where the rest went."""
    from hpc.cluster import records as jobs
    from hpc.cluster import report as rep

    info = rep.collect(jobs.find(job))
    if html_file:
        from hpc.cluster import report_html
        from hpc.contract.atomic import atomic_write

        atomic_write(html_file, report_html.page(info))
    if as_json:
        echo_json(info)
    else:
        click.echo(rep.text(info), nl=False)
        if html_file:
            click.echo(f"page: {html_file}")
