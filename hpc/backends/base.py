"""What every backend does, and the plan: a job's files and the exact command that submits it.

``plan`` is the one path behind ``hpc render``, ``hpc submit --dry-run``, ``hpc submit`` and ``hpc.submit``:
a dry run prints the plan, a submit writes it and runs its command.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hpc import layout
from hpc.config.precedence import Effective
from hpc.errors import HpcError
from hpc.jobs import JobRecord
from hpc.slurm.commands import TaskState


@dataclass(frozen=True)
class Plan:
    effective: Effective
    job_dir: Path
    workdir: Path | None  # where the job runs; None: wherever it is submitted from
    script_name: str
    script: str
    hostfile: str | None
    runtime_config: dict
    template: str
    command: list[str]  # exactly what submits it
    array: list[int] | None  # array task ids; None for a plain job
    extra_files: dict[str, bytes] = field(default_factory=dict)  # e.g. a function job's pickled call

    def files(self) -> dict[str, str | bytes]:
        out: dict[str, str | bytes] = {self.script_name: self.script,
                                       layout.RUNTIME_CONFIG: json.dumps(self.runtime_config, indent=2) + "\n"}
        if self.hostfile is not None:
            out[layout.HOSTFILE] = self.hostfile
        out.update(self.extra_files)
        return out

    def materialize(self, into: Path | None = None) -> list[Path]:
        """Write the files (``into`` a local folder that stands for the job folder, for a remote cluster);
        never over an existing one (a job folder is a record, not a scratch pad)."""
        root = into or self.job_dir
        root.mkdir(parents=True, exist_ok=True)
        written = []
        for name, content in self.files().items():
            target = root / name
            if target.exists():
                raise HpcError(f"{target} already exists", fix="choose another output folder, or remove it first")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
            tmp.write_bytes(content if isinstance(content, bytes) else content.encode())
            if name == self.script_name:
                tmp.chmod(0o755)
            os.replace(tmp, target)
            written.append(target)
        return written


@dataclass(frozen=True)
class Placement:
    """A new job's folder: where the job will find its files, and where this machine writes them first
    (the same folder unless the cluster is remote)."""

    job_dir: Path
    stage: Path


class Backend:
    """A scheduler. Subclasses say how a job is asked for, started, followed and stopped there."""

    name = ""
    script_name = ""
    warns_before_limit = False  # the scheduler signals the job ahead of its time limit
    needs_snapshot = False  # the job cannot run from the submit folder

    # --- planning (torch-free, no scheduler contact) -------------------------------------------------
    def template(self, job) -> str:
        raise NotImplementedError

    def check(self, job, profile, n_sweep: int) -> None:
        """Refuse what this scheduler cannot run, before anything is written."""

    def directives(self, job, profile, job_dir: str, array_spec: str | None) -> list[str]:
        return []

    def known_hosts(self, job) -> list[str] | None:
        """The job's hosts when known before it starts (the hostfile is then rendered at submit)."""
        return None

    def submit_command(self, script: str, workdir: str | None) -> list[str]:
        raise NotImplementedError

    def template_context(self) -> dict:
        """What this scheduler's templates need beyond the job (names its Python side reads back)."""
        return {}

    def plan(self, effective: Effective, job_dir: str | Path, workdir: str | Path | None = None,
             extra_files: dict[str, bytes] | None = None) -> Plan:
        from hpc.render import render

        job_dir = Path(job_dir).absolute()
        request = render(effective, job_dir, workdir, backend=self)
        script = str(job_dir / self.script_name)
        return Plan(effective=effective, job_dir=job_dir, workdir=Path(workdir) if workdir else None,
                    script_name=self.script_name, script=request.script, hostfile=request.hostfile,
                    runtime_config=request.runtime_config, template=request.template,
                    command=self.submit_command(script, str(workdir) if workdir else None),
                    array=request.array, extra_files=dict(extra_files or {}))

    def advise(self, effective: Effective) -> None:
        """Warnings worth a look before submitting (a dry run too); no scheduler contact."""

    # --- the scheduler ----------------------------------------------------------------------------
    def new_job(self, job) -> Placement:
        from hpc import jobs

        folder = jobs.new_job_dir(job.output_dir, job.job_name)
        return Placement(folder, folder)

    def placeholder(self, job) -> Path:
        """What a dry run shows for the folder (named at submit)."""
        from hpc import jobs

        return Path(job.output_dir).absolute() / jobs.placeholder_name(job.job_name)

    def record_fields(self, placement: Placement) -> dict:
        """What a record of a job placed here keeps beyond the common fields."""
        return {}

    def preflight(self, effective: Effective) -> None:
        """Before a submit writes anything: can this scheduler run the job at all?"""

    def start(self, plan: Plan, placement: Placement) -> tuple[str, dict]:
        """Run the plan's command (its files are written in ``placement.stage``); returns (job id, details for
        the record)."""
        raise NotImplementedError

    def states(self, records: list[JobRecord]) -> dict[str, dict[str, TaskState]]:
        """Job folder -> task id -> state, for many jobs at once. An end not known is UNKNOWN, never COMPLETED."""
        raise NotImplementedError

    def cancel(self, record: JobRecord, task: str | None = None) -> None:
        raise NotImplementedError

    # --- the job folder and its logs ------------------------------------------------------------------
    def files(self, record: JobRecord):
        """The job folder, to read what the job wrote."""
        return LocalFiles(record.dir)

    def log_tag(self, record: JobRecord, task: str) -> str:
        """What names a task's attempt in its log files."""
        raise NotImplementedError

    def batch_log(self, record: JobRecord, task: str) -> str:
        """The batch script's own log, relative to logs/."""
        raise NotImplementedError


class LocalFiles:
    """A job folder on this machine, as the backends read it (a remote backend reads the same over SSH)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def list(self, rel_dir: str) -> list[str]:
        try:
            return sorted(os.listdir(self.root / rel_dir))
        except OSError:
            return []

    def read(self, rel: str, offset: int = 0) -> bytes | None:
        try:
            with open(self.root / rel, "rb") as f:
                f.seek(offset)
                return f.read()
        except OSError:
            return None

    def read_all(self, rel_dir: str, suffix: str) -> dict[str, str]:
        """Every <name><suffix> in a folder -> its text without the suffix, in one listing (an array of 10,000
        tasks: no 10,000 failed opens)."""
        out = {}
        for name in self.list(rel_dir):
            if name.endswith(suffix):
                data = self.read(f"{rel_dir}/{name}")
                if data is not None:
                    out[name[:-len(suffix)]] = data.decode(errors="replace").strip()
        return out


def task_files(files, kind: str) -> dict[str, str]:
    """Every tasks/<task>.<kind> of a job: task -> text."""
    return files.read_all(layout.TASKS, f".{kind}")


def lost_nodes(files) -> list[str]:
    """Nodes the job script saw die under this job (tasks/<task>.lost_nodes, a line per loss)."""
    names = set()
    for text in task_files(files, layout.TaskFile.LOST_NODES).values():
        names.update(",".join(text.split()).split(","))
    return sorted(n for n in names if n)


def hang_summary(files) -> str | None:
    """The hang watchdog's verdict (hang/<task>/summary.txt, written by the job's lowest stuck rank)."""
    for task in files.list(layout.HANG):
        data = files.read(f"{layout.HANG}/{task}/summary.txt")
        if data:
            return data.decode(errors="replace").strip()
    return None


def own_state(code: str | None) -> TaskState | None:
    """What the job wrote about its own end (tasks/<task>.exit)."""
    if code is None or not code.lstrip("-").isdigit():
        return None
    return TaskState("COMPLETED" if int(code) == 0 else "FAILED", int(code))


def from_exit_file(record: JobRecord, task: str) -> TaskState | None:
    data = LocalFiles(record.dir).read(f"{layout.TASKS}/{task}.{layout.TaskFile.EXIT}")
    return own_state(data.decode().strip()) if data is not None else None
