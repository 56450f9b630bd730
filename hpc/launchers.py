"""`accelerate.launchers` as hpc spells it: its names, defined in hpc.runtime.process.notebook_launcher."""

from hpc.runtime.process.notebook_launcher import (
    debug_launcher,
    notebook_launcher,
)

__all__ = ['debug_launcher', 'notebook_launcher']
