"""The project's one error type for user mistakes.

A user mistake (bad profile, flag, hostlist, time limit, ...) is reported as one line and exit code 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2


class HpcError(Exception):
    """A mistake in what the user gave us. ``str()`` is the whole one-line message."""

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None):
        self.where = where
        self.fix = fix
        parts = [f"{where}: " if where else "", message]
        if fix:
            parts.append(f"; fix: {fix}")
        super().__init__("".join(parts).replace("\n", "\\n"))


class ConfigError(HpcError):
    """A profile, job file, environment variable or flag holds a value we cannot use."""

    def __init__(self, source: str, key: str, value: object, problem: str, fix: str | None = None):
        self.source, self.key, self.value = source, key, value
        shown = "" if value is MISSING else f" = {value!r}"
        super().__init__(f"{key}{shown}: {problem}", where=source, fix=fix)


class _Missing:
    """Stands for a key that was not given at all (so the message shows no value)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()
