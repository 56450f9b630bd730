"""Job records: one folder per job (its names: ``hpc.contract.layout``), found again through an index that is never
overwritten. Script, command and function jobs alike.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpc.cluster import folders, ownership
from hpc.contract import layout
from hpc.contract.atomic import atomic_write
from hpc.errors import HpcError

RECORD = layout.RECORD
# the forms a job id has: SLURM's (an array task's 12_3 too), and the local backend's local-<hex4><digits>
JOB_ID = re.compile(r"\d+(_\d+)?|local-[0-9a-f]{4}\d+")
JOB_DIR_MODE = 0o700  # a job folder: its code, its pickled call and its result key are no one else's


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
    # a function job's results are signed by the job with this key (HMAC-SHA256, hex); checked before unpickling
    result_key: str | None = None

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

    def task_named(self, task: str) -> str:
        """``task`` if it is one of this job's tasks. Anything else (``../x``, ``1-5``, ``*``, an index the array
        does not have) is refused in one line: a task becomes a SLURM id, a log name and a glob."""
        tasks = self.tasks
        if task not in tasks:
            shown = ", ".join(tasks) if len(tasks) <= 8 else f"{', '.join(tasks[:3])}, ... {tasks[-1]}"
            raise HpcError(f"job {self.job_id} has no task {task!r}", fix=f"use one of {shown}")
        return task

    def mark(self, name: str) -> None:
        """A marker file next to the record (e.g. 'cancelled'); the record itself stays as written."""
        (self.home / name).write_text(f"{time.time()}\n")

    def marked(self, name: str) -> bool:
        return (self.home / name).exists()


def placeholder_name(name: str) -> str:
    """What a dry run shows for the folder ``new_job_dir`` names at submit."""
    return f"{name}-YYYYmmdd-HHMMSS-xxxx"


def new_job_dir(output_dir: str | Path, name: str) -> Path:
    """A fresh folder of this user's alone; mkdir without exist_ok, so two submissions never share one. A job
    root another user owns or may write is refused: they could swap the queued job's code before it runs."""
    base = Path(output_dir).absolute()
    # checked before anything is made in it (it may be /tmp), then as made
    _refuse_unsafe_root(base, next(p for p in [base, *base.parents] if p.exists()), sticky_ok=True)
    make_private_dirs(base)
    _refuse_unsafe_root(base, base)
    for _ in range(10):
        path = base / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        try:
            path.mkdir(mode=JOB_DIR_MODE)  # the umask can only narrow it
            return path
        except FileExistsError:
            continue
    raise HpcError(f"could not create a new job folder under {base}", fix="check the folder's permissions")


def _refuse_unsafe_root(base: Path, checked: Path, sticky_ok: bool = False) -> None:
    why = ownership.insecure(checked, sticky_ok=sticky_ok)
    if why is not None:
        where = "" if checked == base else f"({checked}) "
        raise HpcError(f"the job folder root {base} {where}{why}: another user could change a job before it runs",
                       fix="use an output_dir (--output-dir) of your own that only you can write (chmod go-w)")


def make_private_dirs(path: Path) -> None:
    """mkdir -p where each folder made is this user's alone (mkdir -p would make them as the umask says)."""
    missing = []
    for folder in [path, *path.parents]:
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=JOB_DIR_MODE)
        except FileExistsError:
            pass


def _write_new(path: Path, text: str) -> None:
    """Write a file that must not exist yet, through a temporary name: never half-written, never through a
    link someone put there, readable by this user only."""
    try:
        atomic_write(path, text, mode=0o600, new=True)  # a record is never overwritten
    except FileExistsError:
        raise HpcError(f"{path} already exists", fix="this is a bug or a reused folder: report it") from None


def save(record: JobRecord) -> None:
    _write_new(record.home / RECORD, json.dumps(asdict(record), indent=2) + "\n")
    index = data_dir()
    make_private_dirs(index)
    # a SLURM id can come back (another cluster, a reset one): the index keeps every submission
    stamp = f"{record.submitted_at:.6f}"
    _write_new(index / f"{record.job_id}--{stamp}.json", json.dumps({"job_dir": str(record.home)}) + "\n")


def load_dir(job_dir: Path) -> JobRecord:
    """The record in a job folder, refused unless only this user could have written it, and checked field by
    field: it names commands (a job id, a login node's env lines) that reach a shell."""
    path = Path(job_dir) / RECORD
    why = ownership.insecure(path)
    if why is not None:
        raise HpcError(f"the job record {path} {why}: refused", fix="use records only you can write")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise HpcError(f"cannot read the job record {path}: {e}", fix="check the folder") from None
    return JobRecord(**_checked(data, path))


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "job_id": (str,), "scheduler": (str,), "profile": (str,), "name": (str,), "job_dir": (str,),
    "submitted_at": (int, float), "argv": (list,), "workdir": (str,), "script": (str,),
    "array": (list, type(None)), "snapshot": (dict,), "local": (dict,), "kind": (str,),
    "remote": (dict, type(None)), "record_dir": (str, type(None)), "result_key": (str, type(None)),
}
_REQUIRED = ("job_id", "scheduler", "profile", "name", "job_dir", "submitted_at", "argv", "workdir", "script")
_KINDS = ("script", "module", "command", "function")


def _checked(data, path: Path) -> dict:
    """The record's fields, each of the type it must have; unknown fields (a newer hpc's) are left out."""
    def bad(what: str) -> HpcError:
        return HpcError(f"the job record {path} is malformed: {what}", fix="move the folder away, or remove it")

    if not isinstance(data, dict):
        raise bad("not a JSON object")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise bad(f"no {', '.join(missing)}")
    out = {k: v for k, v in data.items() if k in _FIELD_TYPES}
    for key, value in out.items():
        if not isinstance(value, _FIELD_TYPES[key]) or isinstance(value, bool):
            raise bad(f"{key} is {type(value).__name__}")
    if not JOB_ID.fullmatch(out["job_id"]):
        raise bad(f"job_id {out['job_id']!r} is not a job id")
    from hpc.cluster.config.schema import SCHEDULERS

    if out["scheduler"] not in SCHEDULERS:
        raise bad(f"scheduler {out['scheduler']!r} is not one of {', '.join(sorted(SCHEDULERS))}")
    if out.get("kind", "script") not in _KINDS:
        raise bad(f"kind {out['kind']!r} is not one of {', '.join(_KINDS)}")
    for key in ("job_dir", "record_dir"):
        if out.get(key) is not None and (not os.path.isabs(out[key]) or "\n" in out[key] or "\0" in out[key]):
            raise bad(f"{key} {out[key]!r} is not an absolute path")
    if not all(isinstance(a, str) for a in out["argv"]):
        raise bad("argv holds a non-string")
    if out.get("array") is not None and not all(type(t) is int and t >= 0 for t in out["array"]):
        raise bad("array holds a non-task id")
    local = out.get("local", {})
    if not all(isinstance(v, (str, int, float, type(None))) for v in local.values()):
        raise bad("local holds a nested value")
    if "pid" in local and type(local["pid"]) is not int:
        raise bad("local.pid is not a number")
    if out.get("result_key") is not None and not re.fullmatch(r"[0-9a-f]{64}", out["result_key"]):
        raise bad("result_key is not 64 hex digits")
    if out.get("remote") is not None:
        from hpc.cluster.config.schema import Remote
        from hpc.contract.validate import build

        build(Remote, out["remote"], source=f"the job record {path}")  # raises what is wrong, as one line
    return out


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
    # a job whose folder was deleted (a temporary project, a cleaned-up run) is passed over, as `hpc list` does;
    # newest first, looked at only until one is there
    kept = next((e for e in entries if os.path.lexists(Path(e[2]) / RECORD)), None)
    if kept is None:
        gone = (f"job {ref}'s folder {entries[0][2]} is" if ref
                else f"the folders of all {len(entries)} recorded jobs are")
        raise HpcError(f"{gone} gone (deleted or moved)", fix="give the job's folder if it was moved; see `hpc list`")
    return load_dir(Path(kept[2]))


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
    """Records, newest first, each loaded only when asked for: a caller that stops early reads no more. A
    deleted job folder is passed over; a record that cannot be used is passed over with one line naming it."""
    for _, _, job_dir in _index_entries():
        if not os.path.lexists(Path(job_dir) / RECORD):
            continue
        try:
            yield load_dir(Path(job_dir))
        except HpcError as e:
            folders.note_once(f"hpc: skipping {job_dir}: {e}")


def recent(limit: int) -> list[JobRecord]:
    return list(itertools.islice(iter_recent(), limit))


EARLIER = 50  # how many of the newest records a submit looks through for earlier runs of the same job


def iter_earlier(name: str, profile: str, history: int = EARLIER) -> Iterator[JobRecord]:
    """Among the newest ``history`` records, those of this job name and profile, newest first: what a submit learns
    from earlier runs of the same job (hpc.cluster.lead_time_history, hpc.cluster.fast_tier_fit)."""
    return (r for r in itertools.islice(iter_recent(), history) if r.name == name and r.profile == profile)


