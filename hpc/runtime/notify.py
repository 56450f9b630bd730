"""`python -m hpc.runtime.notify`, the path the batch scripts run (job_templates/_notify.j2, local.sh.j2, and every
job queued before the move): now hpc.runtime.resilience.notify."""

import sys

from hpc.runtime.resilience.notify import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
