"""The `hpc` command. Subcommands load on demand, so `hpc --help` imports click and little else."""

from __future__ import annotations

import importlib
import os
import sys

import click
import click.formatting

from hpc import ACCELERATE_API_VERSION, HPC_VERSION
from hpc.errors import EXIT_USER_ERROR, HpcError, one_line

# name -> (module, attribute, one-line help shown by `hpc --help` without importing the module)
COMMANDS = {
    "submit": ("hpc.cli.submit_cmd", "submit", "Submit a job (or --dry-run: show exactly what would be submitted)."),
    "status": ("hpc.cli.jobs_cmd", "status", "The state of a job, with a summary of its array tasks."),
    "list": ("hpc.cli.jobs_cmd", "list_", "Recent jobs with their live state."),
    "logs": ("hpc.cli.jobs_cmd", "logs", "Print or follow (-f) a job's logs, by rank or all."),
    "cancel": ("hpc.cli.jobs_cmd", "cancel", "Cancel a job, array tasks included."),
    "wait": ("hpc.cli.jobs_cmd", "wait", "Block until a job ends; exit with its exit code."),
    "report": ("hpc.cli.report_cmd", "report",
               "What happened to a job: each attempt's times, steps redone, goodput (--json, --html page)."),
    "launch": ("hpc.cli.launch_cmd", "launch",
               "In a job: start a script with its rank and rendezvous (or --nproc N locally)."),
    "config": ("hpc.cli.config_cmd", "config",
               "Ask what `accelerate config` asks; write a job file; import Accelerate's config files."),
    "test": ("hpc.cli.test_cmd", "test", "Run a short distributed sanity job on a profile, as `accelerate test` does."),
    "render": ("hpc.cli.render_cmd", "render", "Print (or write with -o) the batch script and hostfile of a job."),
    "profile": ("hpc.cli.profile_cmd", "profile", "List, show, validate and create cluster profiles."),
    "estimate-memory": ("hpc.cli.estimate_cmd", "estimate_memory",
                        "Training memory per GPU for each strategy, and the cheapest that fits."),
    "merge-weights": ("hpc.cli.merge_cmd", "merge_weights",
                      "One weights file (safetensors or torch) from a checkpoint, sharded or not."),
    "env": ("hpc.cli.env_cmd", "env", "What a bug report needs: versions, scheduler, profile, GPUs, NICs."),
    "completion": ("hpc.cli.completion_cmd", "completion", "Print the shell completion script (bash, zsh, fish)."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


EPILOG = """\b
Examples:
  hpc submit --profile local --nproc 2 train.py -- --lr 3e-4
  hpc submit -p slurm-local -N 2 --wait train.py
  hpc logs -f
  hpc render --profile slurm-local --nodes 2 train.py -- --lr 3e-4
  hpc render -p perlmutter -N 4 --launcher torchrun --explain train.py
  hpc profile list
  hpc profile validate my-cluster.yaml
"""


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(HPC_VERSION, prog_name="hpc",
                      message=f"%(prog)s %(version)s (Accelerate API {ACCELERATE_API_VERSION})")
def cli():
    """Take a PyTorch training script from one machine to a multi-node SLURM cluster."""


def _usage_error(e: click.ClickException) -> str:
    """click's error as one line: what is wrong, and where the help is (click prints the usage on three)."""
    message = e.format_message()
    ctx = getattr(e, "ctx", None)
    if isinstance(e, click.exceptions.NoSuchOption) and not e.possibilities and ctx is not None:
        # click suggests only close spellings: a flag cut short (--gpus) is named by what it begins
        longer = sorted(o for p in ctx.command.params for o in p.opts if o.startswith(e.option_name))
        if longer:
            message = message.rstrip(".") + f". (Did you mean {' or '.join(repr(o) for o in longer[:3])}?)"
    if isinstance(e, click.exceptions.NoSuchOption) and _takes_script(ctx):
        message += " The script's own arguments go after '--': hpc render train.py -- --lr 3e-4"
    if isinstance(e, click.UsageError) and ctx is not None:
        message = f"{message.rstrip('.')}; fix: see '{ctx.command_path} --help'"
    return message


def _help_width() -> int | None:
    """The help's width by click's own rule (the terminal's columns, at most 80, less 2; at least 50), found here
    because click finds it through shutil, whose import (bz2, lzma) is a tenth of `hpc --help`'s own time.
    None (click decides) where a test runner forces a width."""
    if click.formatting.FORCED_WIDTH is not None:
        return None
    # shutil.get_terminal_size's order: COLUMNS if a positive number, then stdout's terminal, else 80
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
        except (AttributeError, ValueError, OSError):
            columns = 80
    return max(min(columns, 80) - 2, 50)


def _takes_script(ctx) -> bool:
    """Whether the command runs a script with arguments of its own (submit, render, test, launch), for which an
    unknown flag is most likely the script's."""
    params = ctx.command.params if ctx is not None else []
    return any(isinstance(p, click.Argument) and p.name == "args" and p.nargs == -1 for p in params)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="hpc", standalone_mode=False, terminal_width=_help_width())
    except HpcError as e:
        click.echo(f"hpc: error: {one_line(str(e))}", err=True)
        sys.exit(EXIT_USER_ERROR)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as e:
        click.echo(f"hpc: error: {one_line(_usage_error(e))}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
