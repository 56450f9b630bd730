"""`hpc completion SHELL`: print the completion script click generates for `hpc`."""

from __future__ import annotations

import click


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    """Print the completion script for SHELL.

    \b
    Add to ~/.bashrc:   eval "$(hpc completion bash)"
    """
    from click.shell_completion import get_completion_class

    from hpc.cli import cli

    comp = get_completion_class(shell)(cli, {}, "hpc", "_HPC_COMPLETE")
    click.echo(comp.source())
