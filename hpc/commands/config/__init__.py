"""`accelerate.commands.config`: its parsers and Accelerate's config-file helpers."""

from hpc.commands.config.config import config_command, config_command_parser
from hpc.commands.config.config_args import default_config_file, load_config_from_file
from hpc.commands.config.default import default_command_parser, default_config_command, write_basic_config

__all__ = ["config_command", "config_command_parser", "default_command_parser", "default_config_command",
           "default_config_file", "get_config_parser", "load_config_from_file", "write_basic_config"]


def get_config_parser(subparsers=None):
    """`accelerate config`'s parser with its `default` subcommand."""
    import argparse

    parent = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser = config_command_parser(subparsers)
    default_command_parser(parser.add_subparsers(title="subcommands", dest="subcommand"), parents=[parent])
    return parser
