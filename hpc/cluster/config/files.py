"""Config files (profiles, job files, sweeps, Accelerate's) found and read within bounds. Imports no YAML."""

from __future__ import annotations

from pathlib import Path

from hpc.errors import HpcError

MAX_BYTES = 16 * 1024 * 1024  # far above any real config file; a bigger one is a mistake (a log, a dataset)


def is_file(path: Path) -> bool:
    """Path.is_file(), False too for a name the system refuses (too long: ENAMETOOLONG is not ignored there)."""
    try:
        return path.is_file()
    except OSError:
        return False


def read_text(path: Path) -> str:
    """The file's text, refused past MAX_BYTES or when it is not UTF-8."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise HpcError(f"cannot read {path}: {e.strerror}", fix="check the path and its permissions") from None
    if len(raw) > MAX_BYTES:
        raise HpcError(f"is larger than {MAX_BYTES // (1024 * 1024)} MiB; not a config file", where=str(path),
                       fix="check the path")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HpcError(f"is not UTF-8 text (byte {e.start})", where=str(path), fix="save it as UTF-8") from None
