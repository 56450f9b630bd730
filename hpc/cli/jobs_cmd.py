"""Follow jobs: `hpc status`, `hpc list`, `hpc logs`, `hpc cancel`, `hpc wait`."""

from __future__ import annotations

import sys
import time

import click

from hpc.cli.output import echo_json, table


def _describe(record, tasks, per_task: bool = True) -> dict:
    from hpc.cluster import backends, status
    from hpc.cluster.backends import base

    files = backends.for_record(record).files(record)

    overall, code, counts = status.summarize(tasks)
    return {"job_id": record.job_id, "name": record.name, "profile": record.profile, "kind": record.kind,
            "state": overall,
            "exit_code": code,
            "reasons": reasons(tasks),
            "counts": counts, "job_dir": record.job_dir, "submitted_at": record.submitted_at,
            "lost_nodes": base.lost_nodes(files),
            # nodes a spare replaced, from the timelines (not for an array: one more read a task)
            "replaced_nodes": base.replaced_nodes(files) if record.array is None else [],
            "hang": base.hang_summary(files),
            "stragglers": base.stragglers(files), "excluded_nodes": base.excluded_nodes(files),
            "items": base.items_progress(files),
            "cluster": record.local.get("host") if record.remote else None,
            **({"tasks": {t: {"state": s.state, "exit_code": s.exit_code, "reason": s.reason}
                          for t, s in tasks.items()}} if per_task else {})}


def reasons(tasks) -> dict[str, str]:
    """Task -> why it ended without completing, for every task that did."""
    return {t: s.reason for t, s in tasks.items() if s.done and s.state != "COMPLETED" and s.reason}


def reason_lines(why: dict[str, str], array: bool, shown: int = 5) -> list[str]:
    """The reasons as `hpc status` and `hpc wait` print them: a plain job's, or the first few tasks'."""
    if not array:
        return [f"  why: {r}" for r in why.values()]
    lines = [f"  task {t}: {r}" for t, r in list(why.items())[:shown]]
    if len(why) > shown:
        lines.append(f"  ... and {len(why) - shown} more tasks (hpc status --json lists each)")
    return lines


def straggler_lines(stragglers: list[dict], array: bool, shown: int = 5) -> list[str]:
    """The stragglers the job named, as `hpc status` prints them (the first few)."""
    lines = []
    for s in stragglers[:shown]:
        task = f" (task {s['task']})" if array else ""
        try:
            ratio = f"{float(s['ratio']):.1f}x"
        except (TypeError, ValueError):
            ratio = f"{s['ratio']}x"
        lines.append(f"  straggler: rank {s['rank']} on {s['host']} ({ratio} the median step time at step "
                     f"{s['step']}){task}")
    if len(stragglers) > shown:
        lines.append(f"  ... and {len(stragglers) - shown} more stragglers (hpc status --json lists each)")
    return lines


def _counts_text(counts: dict) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


@click.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(job, as_json):
    """The state of JOB (default: the latest), with a summary of array tasks."""
    from hpc.cluster import records as jobs
    from hpc.cluster import status as st

    record = jobs.find(job)
    info = _describe(record, st.states(record))
    if as_json:
        echo_json(info)
        return
    code = "" if info["exit_code"] is None else f" (exit {info['exit_code']})"
    click.echo(f"{record.job_id}  {record.name}  {record.profile}  {info['state']}{code}")
    if record.array is not None:
        click.echo(f"  {len(info['tasks'])} tasks: {_counts_text(info['counts'])}")
    for line in reason_lines(info["reasons"], record.array is not None):
        click.echo(line)
    if info["lost_nodes"]:
        click.echo(f"  lost node(s): {', '.join(info['lost_nodes'])} (later attempts exclude them)")
    for r in info["replaced_nodes"]:
        task = f" (task {r['task']})" if record.array is not None else ""
        click.echo(f"  replaced: {r['lost']} -> {r['by']} (spare) at step {r['step']}{task}")
    if info["excluded_nodes"]:
        click.echo("  excluded node(s): " + "; ".join(f"{n['node']} ({n['why']})" for n in info["excluded_nodes"]))
    for line in straggler_lines(info["stragglers"], record.array is not None):
        click.echo(line)
    if info["hang"]:
        click.echo(f"  {info['hang']}")
    if info["items"]:
        done, total = info["items"]["done"], info["items"]["total"]
        click.echo(f"  items: {done:,} of {total:,} done ({100 * done // total}%)")
    click.echo(f"  {info['cluster'] + ':' if info['cluster'] else ''}{record.job_dir}")  # host:path, as scp has it


@click.command("list")
@click.option("-n", "limit", type=click.IntRange(min=1), default=20, show_default=True, help="How many recent jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(limit, as_json):
    """Recent jobs from this user's records, with their live state."""
    from hpc.cluster import records as jobs
    from hpc.cluster import status as st
    from hpc.errors import HpcError

    records = jobs.recent(limit)
    found: dict[str, dict] = {}
    failed: dict[str, str] = {}
    for backend, group in st.by_backend(records):  # one query per scheduler (or cluster) for every job listed
        try:
            found.update(backend.states(group))
        except HpcError as e:  # e.g. SLURM jobs listed from a machine without SLURM
            failed.update({r.job_dir: str(e) for r in group})
    rows = []
    for record in records:
        if record.job_dir in found:
            rows.append(_describe(record, found[record.job_dir], per_task=False))  # counts: `hpc status` has the rest
        else:
            rows.append({"job_id": record.job_id, "name": record.name, "profile": record.profile,
                         "state": "?", "exit_code": None, "error": failed.get(record.job_dir, "no state"),
                         "job_dir": record.job_dir, "submitted_at": record.submitted_at, "counts": {}})
    if as_json:
        echo_json(rows)
        return
    click.echo(table(["id", "name", "profile", "state", "submitted", "tasks"], [
        (r["job_id"], r["name"], r["profile"], r["state"] + ("" if not r["exit_code"] else f" ({r['exit_code']})"),
         time.strftime("%m-%d %H:%M", time.localtime(r["submitted_at"])),
         _counts_text(r["counts"]) if sum(r["counts"].values()) > 1 else "") for r in rows]))
    for why in dict.fromkeys(r["error"] for r in rows if r["state"] == "?"):  # said once, not on every row
        click.echo(f"? state unknown: {why}")


@click.command()
@click.argument("job", required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the logs grow, until the job ends.")
@click.option("--rank", type=click.IntRange(min=0), help="One rank's log (default: rank 0).")
@click.option("--all", "all_", is_flag=True, help="Every log of the task, each line marked with its file.")
@click.option("--batch", is_flag=True, help="The batch script's own log.")
@click.option("--task", default=None, help="Array task id (default: the first).")
def logs(job, follow, rank, all_, batch, task):
    """Print the logs of JOB (default: the latest job)."""
    from hpc.cluster import records as jobs
    from hpc.cluster import status as st

    record = jobs.find(job)
    task = record.task_named(task) if task is not None else record.tasks[0]
    which = "all" if all_ else ("batch" if batch else "rank")

    def files():
        return st.log_files(record, task, which, rank)

    prefix = all_
    for name, line in st.follow(record, files, keep_going=follow):
        click.echo(f"[{name.rsplit('/', 1)[-1].rsplit('-', 1)[0]}] {line}" if prefix else line)


@click.command()
@click.argument("job")
@click.option("--task", default=None, help="Cancel one array task only.")
def cancel(job, task):
    """Cancel JOB (every array task, unless --task)."""
    from hpc.cluster import backends
    from hpc.cluster import records as jobs

    record = jobs.find(job)
    backends.for_record(record).cancel(record, task)  # each backend refuses a task the job does not have
    click.echo(f"cancelled {record.job_id}{'_' + task if task is not None and record.array is not None else ''}")


@click.command()
@click.argument("job", required=False)
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds (exit 124).")
def wait(job, timeout):
    """Block until JOB ends; exit with its exit code (1 if it ended without one)."""
    from hpc.cluster import records as jobs
    from hpc.cluster import status as st

    record = jobs.find(job)
    try:
        tasks = st.wait(record, timeout)
    except TimeoutError as e:
        click.echo(f"hpc: {e}", err=True)
        sys.exit(124)
    overall, _, counts = st.summarize(tasks)
    code = st.exit_code(tasks)
    click.echo(f"{record.job_id} {overall} (exit {code})" + (f"; {_counts_text(counts)}" if len(tasks) > 1 else ""))
    for line in reason_lines(reasons(tasks), record.array is not None):
        click.echo(line)
    sys.exit(code)
