"""The CLI's side of `hpc profile new --detect` and `hpc profile check`: the questions put on the terminal, and
what is printed. Which SLURM is asked, and the profile made of its answers, is hpc.cluster.config.detect's."""

from __future__ import annotations

import click

from hpc.errors import HpcError


def asker(questions: list):
    """``ask(key)`` for detect.detected_text: the question's prompt on the terminal, its answer."""
    prompts = {key: (prompt, default, tp) for key, prompt, default, tp in questions}

    def ask(key: str):
        prompt, default, tp = prompts[key]
        try:
            return click.prompt(prompt, default=default, type=tp, show_default=True)
        except click.Abort:
            raise HpcError(f"no answer for {key!r} on standard input",
                           fix=f"give --{key.replace('_', '-')}, or -y to leave what SLURM does not say out") from None

    return ask


def check(ref: str) -> None:
    """Print each difference between profile ``ref`` and its live cluster; HpcError (exit 2) if there are any."""
    from hpc.cluster.config import detect, live_check, profiles
    from hpc.slurm.cluster_facts import gather

    prof, path, _ = profiles.load(ref)
    if prof.scheduler != "slurm":
        raise HpcError(f"profile {prof.name} is not a SLURM profile (scheduler: {prof.scheduler})",
                       fix="check a profile with scheduler: slurm")
    slurm, where = detect.live_slurm(prof.remote)
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
