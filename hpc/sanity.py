"""Kept for jobs queued before the move: `python -m hpc.sanity` is now hpc.runtime.sanity."""

import sys

from hpc.contract.sanity_checks import ALL_GATHER, ALL_REDUCE, BARRIER, BROADCAST, CHECKS, PROCESS_GROUP, TRAINING
from hpc.runtime.sanity import BARRIER_DELAY_S, LR, main

__all__ = ["ALL_GATHER", "ALL_REDUCE", "BARRIER", "BARRIER_DELAY_S", "BROADCAST", "CHECKS", "LR", "PROCESS_GROUP",
           "TRAINING", "main"]

if __name__ == "__main__":
    sys.exit(main())
