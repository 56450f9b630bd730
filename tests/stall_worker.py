"""A job that stops advancing, without the weight of a training: its first attempt notes a committed checkpoint at
step 1 (as the Accelerator's save_state does, tests/unit/test_progress_guard.py), and every attempt then asks to
run again (as the warning signal would) without anything newer.

    python stall_worker.py
"""

import os
from pathlib import Path

from hpc.runtime.resilience import progress_guard

if int(os.environ.get("SLURM_RESTART_COUNT") or os.environ.get("HPC_RESTART_COUNT") or 0) == 0:
    progress_guard.note(1)
Path(os.environ["HPC_REQUEUE_FILE"]).write_text("asked by the test\n")
