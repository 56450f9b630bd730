"""The resolved job with every value's source: what precedence.resolve() returns and the backends plan from.

Its own module because it is read far more widely than precedence (render, the backends, submission): they need
the shape, not how it is made.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hpc.cluster.config.schema import ClusterProfile, JobSpec, record
from hpc.contract.validate import field_names


@record
class Effective:
    """The resolved job with every value's source."""

    job: JobSpec
    profile: ClusterProfile
    profile_path: Path
    sources: dict[str, str]
    notes: list = dataclasses.field(default_factory=list)

    def explain_rows(self) -> list[tuple[str, str, str]]:
        rows = []
        for name in field_names(JobSpec):
            value = getattr(self.job, name)
            rows.append((name, _show(value), self.sources.get(name, "default")))
        return rows


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return " ".join(value) if value else "-"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)
