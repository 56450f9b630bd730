"""`accelerate.commands.config.default` (`accelerate config default`): write a basic config file for this
machine without questions."""

from __future__ import annotations

from hpc.commands.config.config_args import default_json_config_file

description = "Create a default config file for Accelerate with only a few flags set."


def write_basic_config(mixed_precision: str = "no", save_location: str = default_json_config_file):
    from hpc.runtime.utilities.config_file import write_basic_config as write

    return write(mixed_precision, save_location)


def default_command_parser(parser, parents):
    parser = parser.add_parser("default", parents=parents, help=description)
    parser.add_argument("--config_file", default=default_json_config_file, dest="save_location",
                        help="Where to write the config file (default: Accelerate's, which `hpc launch` reads).")
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], type=str, default="no",
                        help="Whether or not to use mixed precision training.")
    parser.set_defaults(func=default_config_command)
    return parser


def default_config_command(args) -> None:
    written = write_basic_config(args.mixed_precision, args.save_location)
    if written:
        print(f"accelerate configuration saved at {written}")
