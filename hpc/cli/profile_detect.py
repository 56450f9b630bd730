"""The CLI's side of `hpc profile new --detect` and `hpc profile check`: which SLURM to ask (here, or a profile's
login node over SSH), flags over detected values, and what is printed."""

from __future__ import annotations

import click

from hpc.errors import HpcError

# flag key -> the profile key it sets (the preemption flags go under preemption:)
FLAG_KEYS = {"signal": "preemption.signal", "lead_time": "preemption.lead_time"}
# questions the cluster answers, or says have no answer (MaxTime=UNLIMITED, nodes without GPUs): never asked
# with --detect; a flag still sets them
ANSWERED_BY_CLUSTER = {"scheduler", "partition", "gpus_per_node", "tasks_per_node", "cpus_per_task", "max_time"}


def live_slurm(remote):
    """A Slurm that asks the cluster: over SSH through ``remote`` (a profile's), else this machine's clients."""
    from hpc.slurm.commands import Slurm, require_conf

    if remote is not None:
        from hpc.cluster.ssh import Ssh

        ssh = Ssh(remote)
        return Slurm(run=ssh.run), f"over SSH to {ssh.label}"
    require_conf()
    return Slurm(), "here"


def detected_text(name: str, given: dict, questions: list, yes: bool, remote_ref: str | None) -> str:
    """The new profile's YAML from the live cluster, with ``given`` (the flags) over what was detected."""
    from hpc.cluster.config import detect, profiles
    from hpc.contract.validate import to_plain
    from hpc.slurm.cluster_facts import gather

    if given.get("scheduler") == "local":
        raise HpcError("--detect reads a SLURM cluster; --scheduler local has nothing to detect",
                       fix="drop --scheduler local, or drop --detect")
    remote = None
    if remote_ref:
        prof, _, _ = profiles.load(remote_ref)
        if prof.remote is None:
            raise HpcError(f"profile {prof.name} has no remote (login node) to detect through",
                           fix="name a profile with a remote: block, or run on the login node without --remote")
        remote = prof.remote
    slurm, where = live_slurm(remote)
    facts = gather(slurm, given.get("partition"))
    partition = facts.partition(given.get("partition"))
    if partition is None:
        names = ", ".join(facts.partitions) or "none"
        if given.get("partition"):
            raise HpcError(f"partition {given['partition']!r} does not exist on this cluster (partitions: {names})",
                           fix="give one of them with --partition")
        raise HpcError(f"the cluster has no default partition (partitions: {names})",
                       fix="choose one with --partition")
    entries = [detect.Detected("name", name, ""), detect.Detected("scheduler", "slurm", "")]
    entries += detect.detect(facts, partition, given.get("gpus_per_node"), given.get("qos"))
    if remote is not None:
        settings = {k: v for k, v in to_plain(remote).items() if v not in (None, [], {})}
        entries.append(detect.Detected("remote", settings, f"the login node of profile {remote_ref}"))
    found = {e.key: e for e in entries}
    for key, value in given.items():
        if value in (None, "") or key in ("scheduler", "partition"):
            continue
        target = FLAG_KEYS.get(key, key)
        if key == "modules":
            value = [m.strip() for m in value.split(",") if m.strip()]
        flag = f"--{key.replace('_', '-')}"
        was = found.get(target)
        note = f"{flag}; the cluster says {was.value} ({was.source})" if was and was.value != value else flag
        replacement = detect.Detected(target, value, note)
        if was:
            entries[entries.index(was)] = replacement
        else:
            entries.append(replacement)
        found[target] = replacement
    if not yes:  # what the cluster cannot say (modules, launcher, ...) is asked; -y leaves it out
        for key, prompt, default, tp in questions:
            target = FLAG_KEYS.get(key, key)
            if key in ANSWERED_BY_CLUSTER or target in found or given.get(key) not in (None, ""):
                continue
            try:
                answer = click.prompt(prompt, default=default, type=tp, show_default=True)
            except click.Abort:
                raise HpcError(f"no answer for {key!r} on standard input",
                               fix=f"give --{key.replace('_', '-')}, or -y to leave what SLURM does not say out"
                               ) from None
            if answer not in ("", 0, None):
                if key == "modules":
                    answer = [m.strip() for m in answer.split(",") if m.strip()]
                entries.append(detect.Detected(target, answer, "your answer"))
    asked = "scontrol show partition/node/config" + (", sacctmgr" if facts.access is not None else "")
    header = (f"Written by `hpc profile new --detect` from what SLURM cluster {facts.cluster_name or '?'} said "
              f"about itself ({where}: {asked}). The line above each value says where it came from; what SLURM "
              f"does not state is left out. `hpc profile check {name}` holds it against the cluster again.")
    return detect.render(header, entries)


def check(ref: str) -> None:
    """Print each difference between profile ``ref`` and its live cluster; HpcError (exit 2) if there are any."""
    from hpc.cluster.config import live_check, profiles
    from hpc.slurm.cluster_facts import gather

    prof, path, _ = profiles.load(ref)
    if prof.scheduler != "slurm":
        raise HpcError(f"profile {prof.name} is not a SLURM profile (scheduler: {prof.scheduler})",
                       fix="check a profile with scheduler: slurm")
    slurm, where = live_slurm(prof.remote)
    facts = gather(slurm, prof.partition)
    found = live_check.differences(prof, facts)
    partition = facts.partition(prof.partition)
    for line in found:
        click.echo(f"{prof.name}: {line}")
    if found:
        raise HpcError(f"profile {prof.name} ({path}) does not fit the cluster: {len(found)} "
                       f"difference{'s' if len(found) > 1 else ''}",
                       fix=f"edit {path}, or write a new one with `hpc profile new NAME --detect`")
    click.echo(f"ok: {prof.name} fits the cluster {where} (partition {partition.name if partition else '?'})")
