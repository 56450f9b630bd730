"""Kept for jobs queued before the move: their batch script runs `python -m hpc.script_checkpoints`."""

import sys

from hpc.runtime.checkpoint.script_resume import (
    main,
    naming,
    newest,
    note,
)

__all__ = ['main', 'naming', 'newest', 'note']

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
