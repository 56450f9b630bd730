"""At submit: what earlier jobs of the same name and profile measured of the warning signal's lead time."""

from __future__ import annotations

import sys

from hpc.cluster import records as jobs
from hpc.contract.timings import read, shortfall
from hpc.errors import HpcError


def warn_from_history(name: str, profile: str, lead_time: float, files_of, history: int = jobs.EARLIER
                      ) -> str | None:
    """At submit: what the newest earlier job of this name and profile measured, if lead_time is too short.
    ``files_of(record)``: the submitting backend's reader of a job's files (the same profile, so the same cluster)."""
    for record in jobs.iter_earlier(name, profile, history):
        try:
            timings = read(record.dir, files_of(record))
        except HpcError:  # the cluster cannot be reached now: the submit will say so itself
            return None
        if timings is None:
            continue
        problem = shortfall(timings, lead_time)
        if problem:
            message = f"hpc: warning: job {record.job_id} measured it: {problem}"
            print(message, file=sys.stderr)
            return message
        return None
    return None
