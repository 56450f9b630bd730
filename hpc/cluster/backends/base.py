"""What every backend does, and the plan: a job's files and the exact command that submits it.

``plan`` is the one path behind ``hpc render``, ``hpc submit --dry-run``, ``hpc submit`` and ``hpc.submit``:
a dry run prints the plan, a submit writes it and runs its command.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hpc.cluster.config.effective import Effective
from hpc.cluster.records import JobRecord
from hpc.contract import batch_outputs, layout
from hpc.contract.atomic import atomic_write
from hpc.errors import HpcError
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
            atomic_write(target, content, mode=0o755 if name == self.script_name else None)
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
        from hpc.cluster.render import render

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
        from hpc.cluster import records as jobs

        folder = jobs.new_job_dir(job.output_dir, job.job_name)
        return Placement(folder, folder)

    def placeholder(self, job) -> Path:
        """What a dry run shows for the folder (named at submit)."""
        from hpc.cluster import records as jobs

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
        """Cancel the job, or its one task; a task the job does not have is refused (``record.task_named``)
        before anything is marked or asked."""
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

    def mtime(self, rel: str) -> float | None:
        try:
            return os.stat(self.root / rel).st_mtime
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


def replaced_nodes(files) -> list[dict]:
    """Lost nodes a spare replaced, read off each task's timeline (hpc.contract.timeline.replacements), with the
    task added."""
    from hpc.contract import timeline

    out = []
    for task, text in task_files(files, layout.TaskFile.TIMELINE).items():
        # read_all strips the text: the last line's newline goes back, or parse would take it for a torn write
        out += [{**r, "task": task} for r in timeline.replacements(timeline.parse(text + "\n"))]
    return out


def excluded_nodes(files) -> list[dict]:
    """Nodes the job left out besides lost ones (tasks/<task>.excluded, "<node> <why>" a line each: vetting found
    them bad, a straggler requeue): the first reason per node, in the order noted."""
    found: dict[str, dict] = {}
    for task, text in sorted(task_files(files, layout.TaskFile.EXCLUDED).items()):
        for line in text.splitlines():
            node, _, why = line.partition(" ")
            if node and node not in found:
                found[node] = {"node": node, "why": why.strip(), "task": task}
    return list(found.values())


def stragglers(files) -> list[dict]:
    """The stragglers the job named (tasks/<task>.stragglers, a JSON line each: rank, host, ratio, step, ...),
    each with its task, in the order named; a damaged line is skipped."""
    found = []
    for task, text in sorted(task_files(files, layout.TaskFile.STRAGGLERS).items()):
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and {"rank", "host", "ratio", "step"} <= entry.keys():
                found.append({**entry, "task": task})
    return found


def items_progress(files) -> dict | None:
    """A batch-inference job's items done of total, over its tasks (None: the job writes none)."""
    texts = {name: None for name in files.list(layout.TASKS) if ".items" in name}
    if not texts:
        return None
    read = {name: (files.read(f"{layout.TASKS}/{name}") or b"").decode(errors="replace") for name in texts}
    done = total = 0
    for name, text in read.items():
        task, _, kind = name.partition(".")
        if kind != layout.TaskFile.ITEMS:
            continue
        ranks = [t for n, t in read.items() if n.startswith(f"{task}.{layout.TaskFile.ITEMS}-r")]
        counted = batch_outputs.task_items(text, ranks)
        if counted is not None:
            done, total = done + counted[0], total + counted[1]
    return {"done": done, "total": total} if total else None


def hang_summary(files) -> str | None:
    """The hang watchdog's verdict (hang/<task>/summary.txt, written by the job's lowest stuck rank)."""
    for task in files.list(layout.HANG):
        data = files.read(f"{layout.HANG}/{task}/summary.txt")
        if data:
            return data.decode(errors="replace").strip()
    return None


@dataclass(frozen=True)
class ProcessEnd:
    """How one of a task's processes ended (tasks/<task>.end.<node>.<rank>, noted by the process's shell)."""

    rank: int  # SLURM_PROCID: the rank with srun and deepspeed, the node's agent with torchrun
    host: str
    exit_code: int
    at: float | None  # when it was noted (None where the files' times cannot be read)


# exit codes of a process that was stopped rather than failing by itself: srun's TERM (--kill-on-bad-exit) and
# KILL, a Ctrl-C; 128 + the signal, as the shell reports a death by signal
_STOPPED = {128 + 15, 128 + 9, 128 + 2}


def files_by_task(files) -> dict[str, list[str]]:
    """tasks/, listed once: task -> the names of its files (an array's 10,000 tasks: one listing, not 10,000)."""
    out: dict[str, list[str]] = {}
    for name in files.list(layout.TASKS):
        out.setdefault(name.split(".", 1)[0], []).append(name)
    return out


def process_ends(files, task: str, names: list[str]) -> list[ProcessEnd]:
    """Every process end the task's latest attempt noted (the job script clears them as an attempt starts);
    ``names``: the task's files in tasks/ (files_by_task)."""
    prefix, ends = f"{task}.{layout.TaskFile.END}.", []
    mtime = getattr(files, "mtime", None)  # a folder on another machine may not tell
    for name in names:
        if not name.startswith(prefix):
            continue
        host, _, rank = name[len(prefix):].rpartition(".")  # a host name may hold dots, a rank does not
        data = files.read(f"{layout.TASKS}/{name}")
        code = data.decode(errors="replace").strip() if data is not None else ""
        if host and rank.isdigit() and code.lstrip("-").isdigit():
            ends.append(ProcessEnd(int(rank), host, int(code), mtime(f"{layout.TASKS}/{name}") if mtime else None))
    return ends


def first_failure(ends: list[ProcessEnd]) -> ProcessEnd | None:
    """The process that failed first: the earliest non-zero end, one that failed by itself before one that was
    stopped where the times tie or are unknown (the others usually end because srun stopped them)."""
    failed = [e for e in ends if e.exit_code != 0]
    if not failed:
        return None
    return min(failed, key=lambda e: (e.at if e.at is not None else 0.0, e.exit_code in _STOPPED, e.rank))


def describe_failure(first: ProcessEnd, ends: list[ProcessEnd], launcher: str | None, after: bool = False) -> str:
    """The first failure in words, as `hpc status` shows it; ``after``: a node had left before it (left_first)."""
    code = _code_words(first.exit_code)
    if len(ends) > 1 and all(e.exit_code == first.exit_code for e in ends):
        return f"every process {'then ' if after else ''}ended with {code}"
    who = (f"torchrun's agent on {first.host} (node {first.rank})" if launcher == "torchrun"
           else f"rank {first.rank} on {first.host}")
    if after:
        return f"then {who} {'was stopped' if first.exit_code in _STOPPED else 'failed'} ({code})"
    return f"{who} failed first ({code})"


def left_first(files, task: str, names: list[str], ends: list[ProcessEnd]) -> list[str]:
    """The nodes the task's latest attempt lost, none of whose processes noted an end: they left before any other
    process failed, which a survivor's failure must not hide (it would read as the cause). The attempt's loss is
    the last line of tasks/<task>.lost_nodes when that file is newer than the attempt's jobid file, and than its
    replaced file (a hot spare took the node's place, and the step ran again without it)."""
    mtime = getattr(files, "mtime", None)
    lost, started, replaced = (f"{layout.TASKS}/{task}.{kind}" for kind in (
        layout.TaskFile.LOST_NODES, layout.TaskFile.JOBID, layout.TaskFile.REPLACED))
    if mtime is None or lost.rpartition("/")[2] not in names:
        return []
    lost_at, started_at = mtime(lost), mtime(started)
    if lost_at is None or started_at is None or lost_at < started_at:
        return []  # lost in an earlier attempt (which excluded it since)
    replaced_at = mtime(replaced) if replaced.rpartition("/")[2] in names else None
    if replaced_at is not None and replaced_at >= lost_at:
        return []  # a spare took its place: the run whose ends these are never had it
    lines = (files.read(lost) or b"").decode(errors="replace").split()
    noted = {e.host for e in ends}
    return [n for n in lines[-1].split(",") if n and n not in noted] if lines else []


def silent_first(files, ends: list[ProcessEnd]) -> list[str]:
    """When every process that noted an end was stopped (srun's TERM after another failed), the one that failed
    first noted nothing: killed outright (OOM killer, SIGKILL) or its node gone without being found lost. Those
    missing from a fixed-size job's notes are named; the survivors are never blamed."""
    if not ends or any(e.exit_code not in _STOPPED for e in ends):
        return []
    data = files.read(layout.RUNTIME_CONFIG)
    try:
        config = json.loads(data) if data else {}
    except ValueError:
        config = {}
    launcher, nodes, per_node = config.get("launcher"), config.get("nodes"), config.get("nproc_per_node")
    expected = None
    # an elastic job's or a min_nodes job's attempt may run on fewer nodes than it asked for: no count to hold
    if not config.get("elastic") and not config.get("min_nodes") and isinstance(nodes, int):
        expected = nodes if launcher == "torchrun" else nodes * per_node if isinstance(per_node, int) else None
    noted = {e.rank for e in ends}
    missing = sorted(set(range(expected)) - noted) if expected else []
    if not missing:
        return ["a process that noted no end failed first (killed, or its node died): every one that noted an end "
                "was stopped after it"]
    shown = ",".join(map(str, missing))
    who = f"torchrun's agent of node(s) {shown}" if launcher == "torchrun" else f"rank(s) {shown}"
    return [f"{who} noted no end: failed first (killed, or the node died)"]


def _code_words(code: int) -> str:
    import signal

    if code > 128:
        try:
            return f"exit {code} = 128+{signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exit {code}"


def reasons(files, task: str, names: list[str]) -> list[str]:
    """Why the task's latest attempt ended without its work done, as the job wrote it (tasks/<task>.reason);
    ``names``: the task's files in tasks/ (files_by_task)."""
    name = f"{task}.{layout.TaskFile.REASON}"
    data = files.read(f"{layout.TASKS}/{name}") if name in names else None
    lines = data.decode(errors="replace").splitlines() if data else []
    return list(dict.fromkeys(line.strip() for line in lines if line.strip()))  # every rank may write the same


def launcher_of(files) -> str | None:
    """The job's launcher, from its runtime config (torchrun's processes are agents, one per node)."""
    data = files.read(layout.RUNTIME_CONFIG)
    try:
        return json.loads(data).get("launcher") if data else None
    except (ValueError, AttributeError):
        return None


_PROCESS_FAILURES = ("FAILED", "OUT_OF_MEMORY")


def explain(files, task: str, state: TaskState, names: list[str] | None = None) -> TaskState:
    """An ended task that did not complete, with why: what the job wrote of it, and which process failed first;
    the exit code is that process's (the peers srun stopped exit 143, which reads like a cancel). ``names``: the
    task's files in tasks/, where the caller listed them (files_by_task)."""
    if not state.done or state.state in ("COMPLETED", "CANCELLED"):  # a cancel is its own reason
        return state
    names = files_by_task(files).get(task, []) if names is None else names
    said = reasons(files, task, names)
    code = state.exit_code
    if state.state not in _PROCESS_FAILURES:  # SLURM ended it (time limit, cancel, node): its processes say nothing
        return TaskState(state.state, code, "; ".join(said) or state.reason)
    ends = process_ends(files, task, names)
    first = first_failure(ends)
    left = left_first(files, task, names, ends)
    silent = [] if left else silent_first(files, ends)
    if first is not None:
        said.insert(0, describe_failure(first, ends, launcher_of(files), after=bool(left or silent)))
        code = first.exit_code
    if silent:  # every noted end was a stop: what failed first is among those that noted nothing
        said.insert(0, silent[0])
    if left:  # the cause, before what the survivors did after it
        said.insert(0, f"node(s) {','.join(left)} left first: no process there noted an end (killed, or the node "
                       "died)")
    if not said:
        said.append("the job script ended " + (f"with exit code {code}" if code is not None else "without an exit code")
                    + " and no process noted why; see `hpc logs --all`")
    return TaskState(state.state, code, "; ".join(said) or state.reason)


def own_state(code: str | None) -> TaskState | None:
    """What the job wrote about its own end (tasks/<task>.exit)."""
    if code is None or not code.lstrip("-").isdigit():
        return None
    return TaskState("COMPLETED" if int(code) == 0 else "FAILED", int(code))


def from_exit_file(record: JobRecord, task: str) -> TaskState | None:
    data = LocalFiles(record.dir).read(f"{layout.TASKS}/{task}.{layout.TaskFile.EXIT}")
    return own_state(data.decode().strip()) if data is not None else None
