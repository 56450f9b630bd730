"""`hpc profile list|show|validate|new|check`."""

from __future__ import annotations

from pathlib import Path

import click

from hpc.cli.output import echo_json, table
from hpc.contract.atomic import replacing
from hpc.errors import HpcError


@click.group()
def profile():
    """List, show, validate and create cluster profiles.

    Profiles are found by name in ./cluster_configs, then ~/.config/hpc/cluster_configs
    ($XDG_CONFIG_HOME), then the ones shipped with hpc; or given as a path.
    """


def _origin(path: Path) -> str:
    from hpc.cluster.folders import builtin_dir, user_config_dir

    if path.parent == builtin_dir("cluster_configs"):
        return "built-in"
    if path.parent == user_config_dir() / "cluster_configs":
        return "user"
    return "project"


@profile.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(as_json):
    """The profiles visible from here; the first found of each name wins."""
    from hpc.cluster.config import profiles

    rows = []
    for name, path in profiles.available():
        try:
            prof, _, _ = profiles.load(str(path))
            rows.append({"name": name, "scheduler": prof.scheduler, "where": _origin(path),
                         "description": prof.description, "path": str(path), "error": None})
        except HpcError as e:
            rows.append({"name": name, "scheduler": "?", "where": _origin(path), "description": "",
                         "path": str(path), "error": str(e)})
    if as_json:
        echo_json(rows)
        return
    click.echo(table(["name", "scheduler", "where", "description"],
                     [(r["name"], r["scheduler"], r["where"], r["description"] or f"INVALID: {r['error']}")
                      for r in rows]))


@profile.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(name, as_json):
    """The profile NAME after `extends`, with defaults filled in."""
    import yaml

    from hpc.cluster.config import profiles
    from hpc.contract.validate import to_plain

    prof, path, origin = profiles.load(name)
    data = to_plain(prof)
    if as_json:
        echo_json({"path": str(path), "profile": data, "origin": {k: str(v) for k, v in origin.items()}})
        return
    files = sorted({str(p) for p in origin.values()})
    click.echo(f"# {prof.name}: from {', '.join(files)}")
    click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), nl=False)


@profile.command()
@click.argument("refs", nargs=-1, required=True)
@click.option("--live", is_flag=True, help="Also hold each against its live cluster (as `hpc profile check`).")
def validate(refs, live):
    """Check profiles by name or path; exit 2 at the first invalid one."""
    from hpc.cluster.config import profiles

    for ref in refs:
        prof, path, _ = profiles.load(ref)
        click.echo(f"ok: {prof.name} ({path})")
        if live:
            from hpc.cli.profile_detect import check as check_live

            check_live(ref)


@profile.command()
@click.argument("name")
def check(name):
    """The profile NAME against the live cluster (here, or over SSH through its remote): one line per
    difference (a partition gone, a time above its limit, GPUs the nodes do not have); exit 2 on any."""
    from hpc.cli.profile_detect import check as check_live

    check_live(name)


_QUESTIONS = [
    # (key, prompt, default, type)
    ("scheduler", "Scheduler (slurm or local)", "slurm", click.Choice(["slurm", "local"])),
    ("partition", "Partition (empty for the cluster's default)", "", str),
    ("account", "Account to charge (empty for none)", "", str),
    ("gpus_per_node", "GPUs per node", 0, int),
    ("tasks_per_node", "Processes per node on CPU-only nodes", 1, int),
    ("cpus_per_task", "CPUs per process (0 for SLURM's default)", 0, int),
    ("default_time", "Default time limit", "01:00:00", str),
    ("max_time", "Longest time limit the partition allows (empty if unknown)", "", str),
    ("modules", "Modules to load, comma-separated (empty for none)", "", str),
    ("network_interface", "Network interface for NCCL/gloo, e.g. ib0 (empty to let them choose)", "", str),
    ("launcher", "Launcher", "srun", click.Choice(["srun", "torchrun", "deepspeed"])),
    ("signal", "Signal sent before the time limit", "USR1", click.Choice(["USR1", "USR2", "TERM"])),
    ("lead_time", "Seconds before the time limit to send it", 120, int),
]


def _new_options(fn):
    for key, prompt, _, tp in reversed(_QUESTIONS):
        fn = click.option(f"--{key.replace('_', '-')}", key, type=tp, default=None, help=prompt + ".")(fn)
    return fn


@profile.command()
@click.argument("name")
@_new_options
@click.option("-o", "--out", type=click.Path(dir_okay=False),
              help="Where to write it [default: ./cluster_configs/NAME.yaml].")
@click.option("--yes", "-y", is_flag=True, help="Take the default for every question not given as a flag "
              "(with --detect: leave out what the cluster does not say).")
@click.option("--detect", is_flag=True, help="Read the partition, nodes, GPUs, limits, account, QOS, preemption, "
              "features and network from the live cluster (scontrol, sacctmgr); flags still win.")
@click.option("--remote", "remote_ref", metavar="PROFILE",
              help="With --detect: ask the cluster over SSH through PROFILE's login node (its remote: settings, "
                   "copied into the new profile).")
@click.option("--qos", help="QOS to run in.")
@click.option("--constraint", help="Node features the job needs (sbatch --constraint).")
@click.option("--max-nodes", "max_nodes", type=click.IntRange(min=1), help="Most nodes a job may ask for.")
def new(name, out, yes, detect, remote_ref, qos, constraint, max_nodes, **answers):
    """Create a profile by answering questions; every answer can be given as a flag.

    \b
    Example (no questions asked):
      hpc profile new mycluster --partition gpu --gpus-per-node 4 --launcher torchrun -y
    From what the cluster says about itself (on its login node, or through a profile's remote):
      hpc profile new mycluster --detect -y
    """
    if remote_ref and not detect:
        raise HpcError("--remote names the login node to detect through", fix="add --detect, or drop --remote")
    extra = {"qos": qos, "constraint": constraint, "max_nodes": max_nodes}
    if detect:
        _target(name, out)  # taken: said before the cluster is asked
        from hpc.cli.profile_detect import asker
        from hpc.cluster.config.detect import detected_text

        questions = [] if yes else [key for key, _, _, _ in _QUESTIONS]  # -y leaves out what SLURM does not say
        _write(name, out, detected_text(name, {**answers, **extra}, remote_ref, questions, asker(_QUESTIONS)))
        return
    import yaml

    for key, prompt, default, tp in _QUESTIONS:
        if answers[key] is None and yes:
            answers[key] = default
        elif answers[key] is None:
            try:
                answers[key] = click.prompt(prompt, default=default, type=tp, show_default=True)
            except click.Abort:
                raise HpcError(f"no answer for {key!r} on standard input",
                               fix=f"give --{key.replace('_', '-')}, or -y to take the defaults") from None
    data: dict = {"name": name, "scheduler": answers["scheduler"]}
    for key in ("partition", "account", "default_time", "max_time", "network_interface", "launcher"):
        if answers[key] not in ("", None):
            data[key] = answers[key]
    for key in ("gpus_per_node", "tasks_per_node", "cpus_per_task"):
        if answers[key]:
            data[key] = answers[key]
    if answers["modules"]:
        data["modules"] = [m.strip() for m in answers["modules"].split(",") if m.strip()]
    data.update({k: v for k, v in extra.items() if v not in (None, "")})
    data["preemption"] = {"signal": answers["signal"], "lead_time": answers["lead_time"], "requeue": True}
    _write(name, out, f"# Written by `hpc profile new`; see `hpc profile show {name}` for every key.\n"
           + yaml.safe_dump(data, sort_keys=False))


def _target(name: str, out: str | None) -> tuple[Path, HpcError]:
    """Where the profile goes, and the error if something is there already (raised now if so)."""
    target = Path(out) if out else Path("cluster_configs") / f"{name}.yaml"
    taken = HpcError(f"{target} already exists", fix="choose another name or -o path; hpc never overwrites a profile")
    if target.exists():  # before the folder is made or the profile checked
        raise taken
    return target, taken


def _write(name: str, out: str | None, text: str) -> None:
    """The profile's text into ./cluster_configs/NAME.yaml (or ``out``), validated first; never over a file."""
    from hpc.cluster.config import profiles

    target, taken = _target(name, out)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with replacing(target.absolute(), new=True) as tmp:  # validated before it takes the real name
            tmp.write_text(text)
            profiles.load(str(tmp))
    except FileExistsError:  # made meanwhile
        raise taken from None
    click.echo(f"wrote {target}")
