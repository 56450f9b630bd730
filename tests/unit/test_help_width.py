"""`hpc --help` finds its width without shutil (a tenth of its own start-up), by click's rule to the column."""

import os
import shutil
import subprocess
import sys

import click.formatting
import pytest

from hpc.cli import _help_width


@pytest.mark.parametrize("columns", [None, "120", "79", "60", "30", "0", "-5", "wide"])
def test_width_is_clicks_own(monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    clicks = max(min(shutil.get_terminal_size().columns, 80) - 2, 50)  # click.formatting.HelpFormatter's rule
    assert _help_width() == clicks


def test_a_forced_width_is_left_to_click(monkeypatch):
    monkeypatch.setattr(click.formatting, "FORCED_WIDTH", 80)  # what click's CliRunner sets
    assert _help_width() is None


def test_help_imports_no_shutil_and_wraps_to_columns():
    probe = ("import sys, runpy; sys.argv = ['hpc', '--help']\n"
             "try:\n    runpy.run_module('hpc', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('SHUTIL' if 'shutil' in sys.modules else 'NO-SHUTIL')\n")
    env = {**os.environ, "COLUMNS": "60"}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    *help_lines, verdict = proc.stdout.splitlines()
    assert verdict == "NO-SHUTIL"
    assert any("submit" in line for line in help_lines)
    wrapped = help_lines[:help_lines.index("  Examples:")]  # the examples are kept whole (click's \b paragraph)
    assert max(len(line) for line in wrapped) <= 58 < max(len(line) for line in help_lines)
