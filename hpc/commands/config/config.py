"""`accelerate.commands.config.config` (`accelerate config`): the interactive questionnaire is `hpc config`,
which writes an hpc job file; `config_command(args)` runs it."""

from __future__ import annotations

import argparse
import subprocess
import sys

from hpc.commands.config.config_args import default_config_file

description = ("Launches a series of prompts to create and save a `default_config.yaml` configuration file for your "
               "training system (hpc: `hpc config`, which writes an hpc job file).")


def config_command_parser(subparsers=None):
    if subparsers is not None:
        parser = subparsers.add_parser("config", description=description)
    else:
        parser = argparse.ArgumentParser("Accelerate config command", description=description)
    parser.add_argument("--config_file", default=None, help="Where to write the file (hpc: the job file).")
    if subparsers is not None:
        parser.set_defaults(func=config_command)
    return parser


def config_command(args) -> None:
    argv = [sys.executable, "-m", "hpc", "config"]
    if getattr(args, "config_file", None):
        argv += ["--out", args.config_file]
    subprocess.run(argv, check=True)


__all__ = ["config_command", "config_command_parser", "default_config_file"]
