"""`accelerate.commands.env` (`accelerate env`): what a bug report needs, as Accelerate prints it (the versions,
torch's accelerator, the config file), with hpc's own facts (`hpc env`: scheduler, profile, GPUs)."""

from __future__ import annotations

import argparse
import os
import platform
import shutil

from hpc.commands.config.config_args import default_config_file, load_config_from_file
from hpc.commands.utils import CustomArgumentParser


def env_command_parser(subparsers=None):
    if subparsers is not None:
        parser = subparsers.add_parser("env")
    else:
        parser = CustomArgumentParser("Accelerate env command")
    parser.add_argument("--config_file", default=None, help="The config file to use for the default values.")
    if subparsers is not None:
        parser.set_defaults(func=env_command)
    return parser


def env_command(args: argparse.Namespace) -> dict:
    import numpy as np
    import psutil
    import torch

    from hpc import __version__
    from hpc.cli import env_cmd

    config = "Not found"
    if args.config_file is not None or os.path.isfile(default_config_file):
        config = load_config_from_file(args.config_file).to_dict()
    info = {
        "`Accelerate` version": __version__,
        "Platform": platform.platform(),
        "`accelerate` bash location": shutil.which("hpc") or "Not found",
        "Python version": platform.python_version(),
        "Numpy version": np.__version__,
        "PyTorch version": torch.__version__,
        "PyTorch accelerator": "CUDA" if torch.cuda.is_available() else
        "MPS" if torch.backends.mps.is_available() else "N/A",
        "System RAM": f"{psutil.virtual_memory().total / 1024**3:.2f} GB",
    }
    if torch.cuda.is_available():
        info["GPU type"] = torch.cuda.get_device_name()
    scheduler = env_cmd._scheduler()
    info["SLURM"] = scheduler["slurm_version"] or "not found"
    info["Inside a job"] = scheduler["inside_job"] or "no"
    print("\nCopy-and-paste the text below in your GitHub issue\n")
    print("\n".join(f"- {prop}: {value}" for prop, value in info.items()))
    print("- `Accelerate` default config:" if args.config_file is None else "- `Accelerate` config passed:")
    print("\n".join(f"\t- {prop}: {value}" for prop, value in config.items()) if isinstance(config, dict)
          else f"\t{config}")
    info["`Accelerate` configs"] = config
    return info


def main() -> int:
    env_command(env_command_parser().parse_args())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
