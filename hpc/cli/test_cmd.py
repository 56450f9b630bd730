"""`hpc test`: submit a short sanity job (`python -m hpc.runtime.sanity`) as `hpc submit` would, wait, and judge what
its ranks wrote, as `accelerate test` does for Accelerate."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import click

from hpc.cli.output import echo_json
from hpc.contract import layout
from hpc.contract import sanity_checks as sanity

WORLD_SIZE, DISTINCT, JOB_ENDED = "world size", "distinct ranks", "job ended"


@click.command(epilog="""\b
Examples:
  hpc test --nproc 2
  hpc test -p slurm-local -N 2 --nproc 1
  hpc test -p perlmutter -N 2 --launcher torchrun --json
""")
@click.option("--profile", "-p", envvar="HPC_PROFILE",
              help="Cluster profile name or path [env: HPC_PROFILE; default: local].")
@click.option("--nodes", "-N", type=int, default=None, help="Nodes to allocate.")
@click.option("--nproc", "nproc", type=int, default=None, help="Processes per node (default: the profile's).")
@click.option("--launcher", type=click.Choice(["srun", "torchrun", "deepspeed"]), default=None,
              help="How ranks are started (default: the profile's).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
              help="Seconds to wait for the job, queue included; then it is cancelled and the test fails.")
@click.option("--json", "as_json", is_flag=True, help="Print the checks and the verdict as JSON.")
def test(profile, nodes, nproc, launcher, timeout, as_json):
    """Run a short distributed sanity job on a profile and say whether the setup works."""
    from hpc.cli.job_options import resolve
    from hpc.cluster import backends
    from hpc.cluster.submission import submit

    # DDP whatever the profile's strategy: the training check compares whole weights, which sharding splits up
    # the nodes are vetted first, as a job's would be (SLURM profiles): the same checks, on demand
    flags = {"after": (), "module": "hpc.runtime.sanity", "job_name": "hpc-test", "strategy": "ddp", "nodes": nodes,
             "nproc_per_node": nproc, "launcher": launcher, "vet": True}
    effective = resolve(profile, None, (), None, (), flags)
    job = effective.job
    world = job.nodes * job.nproc_per_node
    started = time.monotonic()
    # the job needs no code of this folder: an empty snapshot keeps it from copying (or importing) the project's
    with tempfile.TemporaryDirectory(prefix="hpc-test-") as empty:
        record = submit(effective, argv=["hpc", *sys.argv[1:]], cwd=Path(empty))
    click.echo(f"hpc test: submitted {record.job_id} ({record.profile}): world {world} on {job.nodes} node(s); "
               f"waiting for it to end (timeout {timeout:g} s)", err=True)
    backend = backends.for_record(record)
    ended = _wait(record, backend, timeout)
    seconds = time.monotonic() - started
    results = [json.loads(text) for text in backend.files(record).read_all(layout.SANITY, ".json").values()]
    checks = vetting_checks(backend.files(record)) + judge(results, world, ended)
    failed = next((c for c in checks if not c["ok"]), None)
    logs = f"{record.job_dir}/logs"
    if as_json:
        echo_json({"passed": failed is None, "job_id": record.job_id, "profile": record.profile, "world": world,
                   "nodes": job.nodes, "seconds": round(seconds, 1), "logs": logs, "checks": checks,
                   "failed": failed["name"] if failed else None})
    else:
        width = max(len(c["name"]) for c in checks)
        for c in checks:
            click.echo(f"  {'ok  ' if c['ok'] else 'FAIL'}  {c['name']:<{width}}  {c['detail']}")
        if failed is None:
            click.echo(f"hpc test: passed (world {world} on {job.nodes} node{'s' if job.nodes > 1 else ''}, "
                       f"{seconds:.1f} s)")
        else:
            click.echo(f"hpc test: FAILED: {failed['name']}: {failed['detail']}; logs: {logs}")
    if failed is not None:
        sys.exit(1)


def _wait(record, backend, timeout: float) -> tuple[bool, str]:
    """(whether the job completed, how it ended). A job still running at the timeout is cancelled: a hung
    sanity job must not hold nodes."""
    from hpc.cluster import status

    seen: dict[str, str] = {}

    class Requeued(Exception):
        pass

    def on_poll(tasks):  # a line each time the job's state changes (PENDING, RUNNING, ...)
        state = status.summarize(tasks)[0] if tasks else None
        if state and state != seen.get("state"):
            if seen.get("state") == "RUNNING" and state in ("PENDING", "REQUEUED"):
                raise Requeued  # vetting left nodes out (or the job was preempted): the test has its answer
            seen["state"] = state
            click.echo(f"hpc test: {record.job_id} {state}", err=True)

    try:
        tasks = status.wait(record, timeout=timeout, on_poll=on_poll)
    except Requeued:
        backend.cancel(record)
        return False, "requeued after its first attempt (see the node checks); cancelled"
    except TimeoutError:
        backend.cancel(record)
        return False, f"still {seen.get('state', 'not started')} after {timeout:g} s; cancelled"
    except KeyboardInterrupt:
        backend.cancel(record)
        click.echo(f"hpc test: cancelled {record.job_id}", err=True)
        raise click.exceptions.Abort() from None
    overall, code, _ = status.summarize(tasks)
    return overall == "COMPLETED", overall if overall == "COMPLETED" else f"{overall} (exit {code})"


def vetting_checks(files) -> list[dict]:
    """One check per node from the first attempt's vetting reports (none where the job was not vetted)."""
    from hpc.contract import vetting_verdict
    from hpc.contract.launch_settings import Vetting

    folder = f"{layout.VETTING}/0/0"
    reports = {name[:-len(".json")]: vetting_verdict.parse_report(files.read(f"{folder}/{name}"))
               for name in files.list(folder) if name.endswith(".json")}
    if not reports:
        return []
    # the profile's thresholds, as the job's runtime config has them (else Vetting's defaults)
    thresholds = (vetting_verdict.parse_report(files.read(layout.RUNTIME_CONFIG)) or {}).get("vetting") or {}
    defaults = Vetting()
    out = []
    for v in vetting_verdict.judge(reports, thresholds.get("relative_speed", defaults.relative_speed),
                                   thresholds.get("min_bandwidth", defaults.min_bandwidth)):
        measured = f"{v.compute or 0:.3g} GFLOP/s, best link {v.bandwidth or 0:.3g} GB/s"
        out.append({"name": f"node {v.host}", "ok": v.fit,
                    "detail": measured if v.fit else f"{vetting_verdict.reason(v)} ({measured})"})
    return out


def judge(results: list[dict], world: int, ended: tuple[bool, str]) -> list[dict]:
    """Every rank's file -> one verdict per check, in the order the ranks ran them."""
    results = sorted(results, key=lambda r: r["rank"])
    out = [_world_size(results, world, ended), _distinct(results, world)]
    for name in sanity.CHECKS:
        ok, detail = _per_rank(results, name, sanity.CHECKS, "killed, or hung" if ended[0] else ended[1])
        if ok and name == sanity.BROADCAST:
            ok, detail = _same(results, name, "ranks got different values")
        if ok and name == sanity.TRAINING:
            ok, detail = _same(results, name, "ranks hold different weights after the step")
        out.append({"name": name, "ok": ok, "detail": detail})
    out.append({"name": JOB_ENDED, "ok": ended[0], "detail": ended[1]})
    return out


def _world_size(results: list[dict], world: int, ended: tuple[bool, str]) -> dict:
    if not results:  # the job never ran (still queued), or died before python did (see its batch log)
        why = "see the logs" if ended[0] else f"job {ended[1]}"
        return {"name": WORLD_SIZE, "ok": False, "detail": f"no rank wrote a result ({why})"}
    wrong = [r for r in results if r["world"] != world]
    detail = (f"rank {wrong[0]['rank']} on {wrong[0]['host']} saw world {wrong[0]['world']}, expected {world}"
              if wrong else f"every rank saw {world}")
    return {"name": WORLD_SIZE, "ok": not wrong, "detail": detail}


def _distinct(results: list[dict], world: int) -> dict:
    ranks = [r["rank"] for r in results]
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    missing = sorted(set(range(world)) - set(ranks))
    problems = [f"rank {r} seen {ranks.count(r)} times" for r in twice]
    if missing:
        problems.append(f"no result from rank(s) {', '.join(map(str, missing))}")
    hosts = sorted({r["host"] for r in results})
    detail = "; ".join(problems) or f"ranks 0-{world - 1} on {len(hosts)} host(s): {', '.join(hosts)}"
    return {"name": DISTINCT, "ok": not problems, "detail": detail}


def _per_rank(results: list[dict], name: str, order: tuple[str, ...], why_stopped: str) -> tuple[bool, str]:
    if not results:
        return False, "no rank wrote a result"
    for r in results:
        check = r["checks"].get(name)
        if check is None:
            # the check a rank stopped at carries its error; later ones just were not reached
            stopped_here = next(c for c in order if c not in r["checks"]) == name
            if r["error"] and stopped_here:
                return False, f"rank {r['rank']}: {r['error']}"
            return False, f"rank {r['rank']} did not get this far" + ("" if r["error"] else f" (job {why_stopped})")
        if not check["ok"]:
            return False, f"rank {r['rank']}: {check['detail']}"
    return True, results[0]["checks"][name]["detail"]


def _same(results: list[dict], name: str, problem: str) -> tuple[bool, str]:
    """Each rank judged only itself; what rank 0 sent (or holds) must also be what every other rank has."""
    values = [r["checks"][name]["value"] for r in results]
    first = results[0]["checks"][name]["detail"]
    if isinstance(values[0], list):
        diff = max(abs(a - b) for v in values for a, b in zip(v, values[0]))
        return diff <= 1e-5, first if diff <= 1e-5 else f"{problem} (max diff {diff:.1e})"
    same = len(set(values)) == 1
    return same, first if same else f"{problem}: {sorted(set(values))}"
