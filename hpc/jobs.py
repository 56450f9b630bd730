"""Job records: one folder per job (its names: ``hpc.layout``), found again through an index that is never
overwritten. Script, command and function jobs alike.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from hpc import layout
from hpc.errors import HpcError

RECORD = layout.RECORD


def data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "hpc" / "jobs"


@dataclass
class JobRecord:
    job_id: str
    scheduler: str
    profile: str
    name: str
    job_dir: str
    submitted_at: float
    argv: list[str]
    workdir: str
    script: str
    array: list[int] | None = None  # array task ids; None for a plain job
    snapshot: dict = field(default_factory=dict)
    local: dict = field(default_factory=dict)  # pid and start time of a local job
    kind: str = "script"  # script | module | command | function
    # a job on a remote cluster: job_dir is a path there; its record (and a copy of what was sent) stays here
    remote: dict | None = None  # the profile's `remote` settings
    record_dir: str | None = None

    @property
    def dir(self) -> Path:
        """The job folder, where the job writes (on the cluster, for a remote job: read it via its backend)."""
        return Path(self.job_dir)

    @property
    def home(self) -> Path:
        """Where the record and its markers live, on this machine."""
        return Path(self.record_dir or self.job_dir)

    @property
    def tasks(self) -> list[str]:
        return [str(t) for t in self.array] if self.array is not None else ["0"]

    def mark(self, name: str) -> None:
        """A marker file next to the record (e.g. 'cancelled'); the record itself stays as written."""
        (self.home / name).write_text(f"{time.time()}\n")

    def marked(self, name: str) -> bool:
        return (self.home / name).exists()


def placeholder_name(name: str) -> str:
    """What a dry run shows for the folder ``new_job_dir`` names at submit."""
    return f"{name}-YYYYmmdd-HHMMSS-xxxx"


def new_job_dir(output_dir: str | Path, name: str) -> Path:
    """A fresh folder; mkdir without exist_ok, so two submissions never share one."""
    base = Path(output_dir).absolute()
    base.mkdir(parents=True, exist_ok=True)
    for _ in range(10):
        path = base / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise HpcError(f"could not create a new job folder under {base}", fix="check the folder's permissions")


def _write_new(path: Path, text: str) -> None:
    """Write a file that must not exist yet (O_EXCL), through a temporary name: never half-written."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    try:
        os.link(tmp, path)  # fails if path exists: a record is never overwritten
    except FileExistsError:
        raise HpcError(f"{path} already exists", fix="this is a bug or a reused folder: report it") from None
    finally:
        tmp.unlink()


def save(record: JobRecord) -> None:
    _write_new(record.home / RECORD, json.dumps(asdict(record), indent=2) + "\n")
    index = data_dir()
    index.mkdir(parents=True, exist_ok=True)
    # a SLURM id can come back (another cluster, a reset one): the index keeps every submission
    stamp = f"{record.submitted_at:.6f}"
    _write_new(index / f"{record.job_id}--{stamp}.json", json.dumps({"job_dir": str(record.home)}) + "\n")


def load_dir(job_dir: Path) -> JobRecord:
    try:
        data = json.loads((job_dir / RECORD).read_text())
    except (OSError, ValueError) as e:
        raise HpcError(f"cannot read the job record in {job_dir}: {e}", fix="check the folder") from None
    return JobRecord(**data)


def find(ref: str | None) -> JobRecord:
    """A job by id (the newest submission with that id), by its folder, or the latest job when None."""
    if ref and (Path(ref) / RECORD).is_file():
        return load_dir(Path(ref))
    entries = _index_entries()
    if ref is not None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", ref):
            raise HpcError(f"{ref!r} is not a job id", fix="give the id that `hpc submit` printed, or a job folder")
        entries = [e for e in entries if e[1] == ref]
    if not entries:
        raise HpcError(f"no job {ref!r} in this user's records" if ref else "no jobs submitted yet",
                       fix="see `hpc list`")
    return load_dir(Path(entries[0][2]))


def _index_entries() -> list[tuple[float, str, str]]:
    out = []
    index = data_dir()
    if not index.is_dir():
        return out
    for path in index.glob("*--*.json"):
        job_id, _, stamp = path.stem.rpartition("--")
        try:
            out.append((float(stamp), job_id, json.loads(path.read_text())["job_dir"]))
        except (ValueError, KeyError, OSError):
            continue  # a foreign or damaged entry must not hide the others
    return sorted(out, reverse=True)


def iter_recent() -> Iterator[JobRecord]:
    """Records, newest first, each loaded only when asked for: a caller that stops early reads no more."""
    for _, _, job_dir in _index_entries():
        try:
            yield load_dir(Path(job_dir))
        except HpcError:
            continue  # a deleted job folder


def recent(limit: int) -> list[JobRecord]:
    return list(itertools.islice(iter_recent(), limit))


def array_indices(spec: str) -> list[int]:
    """'0-99%8', '1,3,5-7', '0-10:2' -> the task ids."""
    out: list[int] = []
    for item in spec.split("%")[0].split(","):
        rng, _, step = item.partition(":")
        lo, _, hi = rng.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1, int(step or 1)))
    return out
