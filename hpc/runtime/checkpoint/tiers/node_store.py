"""This job's private folder in node memory: ``<directory>/hpc-<uid>-<job>/``, mode 0700, owned by the user.

Inside it, a committed checkpoint per saved rank and step, in the checkpointer's format (files + manifest.json
written last): ``own/rank-<r>/step-<N>/`` for the ranks of this node, ``peer/rank-<r>/step-<N>/`` for the copies
another node sent. A folder of another user, or not private, is refused (never read, never written into); another
job's folder is never read (the folder name holds the job) and is swept away once that job no longer runs, so a
node does not keep losing memory to jobs that were killed before they could clean up.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from hpc.errors import HpcError
from hpc.runtime.checkpoint.store import CheckpointStore

KINDS = ("own", "peer")
_FOLDER = re.compile(r"^hpc-(\d+)-([A-Za-z0-9_.-]+)$")
_RANK = re.compile(r"^rank-(\d+)$")
KEEP = 2  # per saved rank and kind: the newest may be cut short by a crash, the one before it stands


def job_key(environ=os.environ) -> str:
    """What names this job on every node and in every attempt: SLURM's job id (a requeue keeps it), else the job
    folder's name (local jobs)."""
    job = environ.get("SLURM_JOB_ID") or Path(environ.get("HPC_JOB_DIR", "") or f"pid{os.getpid()}").name
    task = environ.get("SLURM_ARRAY_TASK_ID")
    key = f"{job}_{task}" if task else job
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)


def untrusted(path: Path, uid: int) -> str | None:
    """Why ``path`` is not this user's private folder (None: it is): a link, not a folder, another owner, or
    open to others."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder"
    if info.st_uid != uid:
        return f"{path} belongs to uid {info.st_uid}, not to this user (uid {uid})"
    if info.st_mode & 0o077:
        return f"{path} has mode {stat.S_IMODE(info.st_mode):o}: others can enter it (0700 expected)"
    return None


class NodeStore:
    def __init__(self, directory: str | os.PathLike, job: str, uid: int | None = None):
        self.base = Path(directory)
        self.uid = os.getuid() if uid is None else uid
        self.job = job
        self.path = self.base / f"hpc-{self.uid}-{job}"

    def open(self) -> Path:
        """Make (or find, after a requeue on this node) the job's folder, and check it is ours and private."""
        if not self.base.is_dir():
            raise HpcError(f"the fast tier's folder {self.base} does not exist on {os.uname().nodename}",
                           fix="set fast_tier.directory in the profile to a node-local folder every node has")
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            pass
        problem = untrusted(self.path, self.uid)
        if problem:
            raise HpcError(f"the fast tier's folder is refused: {problem}",
                           fix="remove it (or ask its owner to); hpc makes it again, private to you")
        return self.path

    def trusted(self) -> bool:
        return untrusted(self.path, self.uid) is None

    def folder(self, kind: str, rank: int) -> Path:
        return self.path / kind / f"rank-{rank}"

    def store(self, kind: str, rank: int) -> CheckpointStore:
        return CheckpointStore(self.folder(kind, rank), keep=KEEP)

    def holdings(self) -> list[tuple[str, int, CheckpointStore]]:
        """Every (kind, saved rank, store) this node holds for this job; nothing if the folder is not trusted."""
        if not self.trusted():
            return []
        out = []
        for kind in KINDS:
            where = self.path / kind
            if not where.is_dir():
                continue
            for child in sorted(where.iterdir()):
                m = _RANK.match(child.name)
                if m and child.is_dir() and not child.is_symlink():
                    out.append((kind, int(m.group(1)), CheckpointStore(child, keep=KEEP)))
        return out

    def free_bytes(self) -> int:
        st = os.statvfs(self.base)
        return st.f_bavail * st.f_frsize

    def remove(self) -> None:
        """The job is over (or gave its node up): its memory goes back to the node."""
        if self.trusted():
            shutil.rmtree(self.path, ignore_errors=True)

    def sweep(self, running: Callable[[list[str]], set[str]]) -> list[Path]:
        """Remove this user's folders of jobs that no longer run (``running(jobs)``: those of ``jobs`` still
        running or pending). Another user's folders are never touched."""
        if not self.base.is_dir():
            return []
        others: dict[str, Path] = {}
        for child in self.base.iterdir():
            m = _FOLDER.match(child.name)
            if m and int(m.group(1)) == self.uid and m.group(2) != self.job and untrusted(child, self.uid) is None:
                others[m.group(2)] = child
        if not others:
            return []
        alive = running(sorted(others))
        gone = [path for job, path in others.items() if job not in alive]
        for path in gone:
            shutil.rmtree(path, ignore_errors=True)
        return gone


def slurm_running(jobs: list[str]) -> set[str]:
    """Those of ``jobs`` SLURM still runs or holds (one squeue call). Outside SLURM, or when SLURM cannot say,
    all of them: a folder is kept rather than removed under a live job (a local run removes its own at its end)."""
    ids = [j for j in jobs if re.fullmatch(r"\d+(_\d+)?", j)]
    if not os.environ.get("SLURM_JOB_ID") or not ids:
        return set(jobs)
    from hpc.slurm.commands import Slurm  # only a job with a fast tier asks, once at its start

    try:
        queue = Slurm().queue(",".join(ids))
    except HpcError:
        return set(jobs)
    return {j for j in jobs if j in queue or j not in ids}
