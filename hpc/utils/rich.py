"""`accelerate.utils.rich`: importing it installs rich's tracebacks (hpc.runtime.utilities.rich_tracebacks)."""

import hpc.runtime.utilities.rich_tracebacks  # noqa: F401
