"""`accelerate.commands.launch`: `launch_command_parser()` parses `accelerate launch`'s command line (every flag of
hpc/cli/accelerate_flags.py, with underscores or dashes), and `launch_command(args)` runs it as `hpc launch`, in
a child process, raising CalledProcessError when the script fails (as Accelerate's launcher does)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from hpc.cli.accelerate_flags import FLAG, FLAGS, MANY
from hpc.commands.utils import CustomArgumentParser

description = ("Launch a python script in a distributed scenario. Arguments can be passed in with either hyphens "
               "(`--num-processes=2`) or underscores (`--num_processes=2`)")
# the flags whose value Accelerate's argparse checks against a list
_CHOICES = {"mixed_precision": ["no", "fp16", "bf16", "fp8"]}


def launch_command_parser(subparsers=None):
    if subparsers is not None:
        parser = subparsers.add_parser("launch", description=description, allow_abbrev=False)
    else:
        parser = CustomArgumentParser("Accelerate launch command", description=description, allow_abbrev=False)
    for setting, kind in FLAGS.items():
        names = [f"--{setting}"] + (["-q"] if setting == "quiet" else [])
        if kind == FLAG:
            parser.add_argument(*names, action="store_true", default=False)
        elif kind == MANY:
            parser.add_argument(*names, action="append", default=None)
        else:
            parser.add_argument(*names, type=kind, default=None, choices=_CHOICES.get(setting))
    parser.add_argument("-m", "--module", action="store_true", default=False,
                        help="Interpret the script as a python module (python -m).")
    parser.add_argument("training_script", type=str, help="The script (or module) to launch, then its arguments.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Arguments of the training script.")
    if subparsers is not None:
        parser.set_defaults(func=launch_command)
    return parser


def hpc_launch_argv(args: argparse.Namespace) -> list[str]:
    """The `hpc launch` command line for parsed `accelerate launch` arguments: the flags given, then the script."""
    argv = [sys.executable, "-m", "hpc", "launch"]
    for setting, kind in FLAGS.items():
        value = getattr(args, setting, None)
        if value is None or value is False:
            continue
        if kind == FLAG:
            argv.append(f"--{setting}")
        elif kind == MANY:
            for item in value:
                argv += [f"--{setting}", str(item)]
        else:
            argv += [f"--{setting}", str(value)]
    if getattr(args, "module", False):
        argv.append("-m")
    return [*argv, args.training_script, *list(args.training_script_args or [])]


def launch_command(args: argparse.Namespace) -> None:
    subprocess.run(hpc_launch_argv(args), check=True)


def main() -> None:
    launch_command(launch_command_parser().parse_args())


if __name__ == "__main__":
    main()
