"""`accelerate.commands.utils`: an argparse parser whose long options are spelled with underscores or dashes,
as Accelerate's (and hpc's) commands take them."""

from __future__ import annotations

import argparse


class CustomArgumentParser(argparse.ArgumentParser):
    """``add_argument("--num_processes")`` also accepts ``--num-processes`` (and the other way round)."""

    def add_argument(self, *args, **kwargs):
        return super().add_argument(*_both_spellings(args), **kwargs)

    def add_argument_group(self, *args, **kwargs):
        group = super().add_argument_group(*args, **kwargs)
        add = group.add_argument
        group.add_argument = lambda *a, **k: add(*_both_spellings(a), **k)
        return group


def _both_spellings(args: tuple) -> list:
    out = list(args)
    for arg in args:
        if isinstance(arg, str) and arg.startswith("--"):
            for other in (arg.replace("_", "-"), "--" + arg[2:].replace("-", "_")):
                if other not in out:
                    out.append(other)
    return out
