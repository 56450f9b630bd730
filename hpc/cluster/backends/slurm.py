"""SLURM: sbatch scripts, one squeue and one sacct for any number of jobs, scancel."""

from __future__ import annotations

import json
import os

from hpc.cluster import lead_time_history
from hpc.cluster.backends.base import (
    Backend,
    Placement,
    Plan,
    explain,
    files_by_task,
    own_state,
    task_files,
)
from hpc.cluster.folders import user_cache_dir
from hpc.cluster.records import JobRecord
from hpc.contract import layout
from hpc.errors import HpcError
from hpc.slurm import array_spec, formats, hostlist
from hpc.slurm.commands import Slurm, TaskState, check_fits, require_conf

# How long the job script keeps asking a controller that does not answer (scontrol requeue after the warning
# signal, scontrol show job after a failure) before the job ends FAILED, the reason in tasks/<task>.reason.
CONTROLLER_PATIENCE_S = 300


def gpu_request(job, profile) -> tuple[str, str]:
    """(sbatch option, value) asking for the job's GPUs, as the profile's site spells it."""
    typed = f"{profile.gpu_type}:" if profile.gpu_type else ""
    if profile.gres_style == "gres":
        return "gres", f"gpu:{typed}{job.gpus_per_node}"
    return "gpus-per-node", f"{typed}{job.gpus_per_node}"


def dependency(job) -> str:
    """``--after 12:afterany --after 13`` -> ``afterany:12,afterok:13`` (checks.after wrote JOB:TYPE)."""
    return ",".join(f"{kind}:{jid}" for jid, kind in (a.split(":") for a in job.after))


def directives(job, profile, job_dir: str, array_spec: str | None) -> list[str]:
    """The #SBATCH options, each already checked to be free of shell and whitespace characters."""
    # spare nodes are allocated too: vetting starts the job on the best `nodes` of them
    d = [f"--job-name={job.job_name}", f"--nodes={job.nodes + job.spare_nodes}",
         f"--ntasks-per-node={job.ntasks_per_node}"]
    if job.cpus_per_task:
        # cpus_per_task is per process; an agent (torchrun, deepspeed) task holds all of its node's processes
        per_task = job.cpus_per_task * (job.nproc_per_node if job.launcher != "srun" else 1)
        d.append(f"--cpus-per-task={per_task}")
    if job.gpus_per_node:
        key, value = gpu_request(job, profile)
        d.append(f"--{key}={value}")
    if job.mem:
        d.append(f"--mem={job.mem}")
    if job.mem_per_gpu:
        d.append(f"--mem-per-gpu={job.mem_per_gpu}")
    d.append(f"--time={formats.format_time(formats.parse_time(job.time))}")
    for key in ("partition", "account", "qos", "constraint", "reservation", "nodelist"):
        value = getattr(job, key)
        if value:
            d.append(f"--{key}={value}")
    if array_spec:
        d.append(f"--array={array_spec}")
    if job.after:
        d.append(f"--dependency={dependency(job)}")
    if job.env_passthrough is not None:
        d.append("--export=" + (",".join(job.env_passthrough) or "NONE"))
    folder = layout.JobFolder(job_dir)
    d.append(f"--output={folder.logs()}/{folder.batch_log_pattern(bool(array_spec))}")
    d.append("--open-mode=append")  # a requeued job appends to its log instead of truncating it
    pre = profile.preemption
    d.append(f"--signal=B:{pre.signal}@{pre.lead_time}")
    d.append("--requeue" if pre.requeue else "--no-requeue")
    if job.elastic or job.replaces_lost_nodes:  # a node that fails must not end the job: the others go on without it
        d.append("--no-kill")
    d.extend(profile.sbatch_extra)
    return d


class SlurmBackend(Backend):
    name = "slurm"
    script_name = "job.sbatch"
    warns_before_limit = True

    def __init__(self, slurm: Slurm | None = None):
        self.slurm = slurm or Slurm()

    def check(self, job, profile, n_sweep: int) -> None:
        limit = profile.max_array_size or array_spec.DEFAULT_MAX_ARRAY_SIZE
        if n_sweep > limit:  # a sweep is an array 0-(n-1)
            raise HpcError(f"the sweep makes {n_sweep} array tasks; the cluster's MaxArraySize is {limit}",
                           fix="split the sweep, or set max_array_size to the cluster's (slurm.conf MaxArraySize)")
        if job.gpu_ids:
            raise HpcError(f"gpu_ids = {job.gpu_ids}: SLURM gives each job its own GPUs",
                           fix="drop gpu_ids (--gpu_ids), and ask for GPUs with --gpus-per-node")

    def template(self, job) -> str:
        return f"{job.launcher}.sbatch.j2"

    def directives(self, job, profile, job_dir: str, array_spec: str | None) -> list[str]:
        return directives(job, profile, job_dir, array_spec)

    def known_hosts(self, job) -> list[str] | None:
        if not job.nodelist:
            return None
        hosts = hostlist.expand(job.nodelist)
        if len(hosts) != job.nodes + job.spare_nodes:
            spare = f" plus {job.spare_nodes} spare" if job.spare_nodes else ""
            raise HpcError(f"--nodelist {job.nodelist} names {len(hosts)} hosts but --nodes is {job.nodes}{spare}",
                           fix="make them agree")
        return hosts

    def submit_command(self, script: str, workdir: str | None) -> list[str]:
        return ["sbatch", "--parsable", *([f"--chdir={workdir}"] if workdir else []), script]

    def template_context(self) -> dict:
        return {"controller_patience": CONTROLLER_PATIENCE_S}

    def advise(self, effective) -> None:
        job, profile = effective.job, effective.profile
        lead_time_history.warn_from_history(job.job_name, profile.name, profile.preemption.lead_time, self.files)

    def require_conf(self) -> None:
        require_conf()

    def preflight(self, effective) -> None:
        job = effective.job
        self.require_conf()
        check_fits(self.slurm, job.partition, job.nodes + job.spare_nodes, job.time, job.gpus_per_node)

    def start(self, plan: Plan, placement: Placement) -> tuple[str, dict]:
        self.require_conf()
        return self.slurm.submit_argv(plan.command), {}

    # --- states: squeue, then accounting, then the job's own record; never assume COMPLETED ----------
    def states(self, records: list[JobRecord]) -> dict[str, dict[str, TaskState]]:
        if not records:
            return {}
        return self.decide_all(records, self.collect(records))

    def collect(self, records: list[JobRecord]) -> "Facts":
        """squeue for every job, then accounting and the job folders for what squeue no longer shows."""
        self.require_conf()
        live = self.slurm.queue(",".join(dict.fromkeys(r.job_id for r in records)))
        ended = [r for r in records if any(task_id(r, t) not in live for t in r.tasks)]
        facts = Facts(live)
        if not ended:
            return facts
        source = self._accounting_source()
        if source != "dbd":  # the jobcomp file knows array tasks by their raw ids only
            facts.raw_ids = {r.job_dir: task_files(self.files(r), layout.TaskFile.JOBID) for r in ended
                             if r.array is not None}
        ask = dict.fromkeys(i for r in ended for t in r.tasks for i in facts.accounting_ids(r, t, asking=True))
        facts.acct = self.slurm.accounting_many(list(ask), source)
        facts.exits = {r.job_dir: task_files(self.files(r), layout.TaskFile.EXIT) for r in ended}
        return facts

    def decide_all(self, records: list[JobRecord], facts: "Facts") -> dict[str, dict[str, TaskState]]:
        out: dict[str, dict[str, TaskState]] = {}
        for record in records:
            tasks = out[record.job_dir] = {}
            listing = None  # tasks/, listed once per job, only if a task ended without completing
            for task in record.tasks:
                now = facts.live.get(task_id(record, task))
                if now is not None:
                    tasks[task] = TaskState(now[0], None, now[2])
                    continue
                rows = [row for i in facts.accounting_ids(record, task) for row in facts.acct.get(i, ())]
                since = record.local.get("submitted_on_cluster", record.submitted_at)  # accounting's clock
                state = decide(record, _newest_since(rows, since),
                               own_state(facts.exits.get(record.job_dir, {}).get(task)))
                if state.done and state.state != "COMPLETED":
                    files = self.files(record)
                    listing = files_by_task(files) if listing is None else listing
                    state = explain(files, task, state, listing.get(task, []))
                tasks[task] = state
        return out

    def _accounting_source(self) -> str | None:
        """'dbd' or 'jobcomp', remembered per cluster: asking costs a SLURM call each time."""
        key = self.accounting_key()
        cache = user_cache_dir() / "slurm-accounting.json"
        try:
            known = json.loads(cache.read_text())
        except (OSError, ValueError):
            known = {}
        if key in known:
            return known[key]
        source = self.slurm.accounting_source()
        if source is not None:
            try:
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps({**known, key: source}))
            except OSError:
                pass
        return source

    def accounting_key(self) -> str:
        """Names the cluster in the cache of accounting sources."""
        return os.environ.get("SLURM_CONF") or "default"

    def cancel(self, record: JobRecord, task: str | None = None) -> None:
        target = record.job_id if task is None else task_id(record, record.task_named(task))  # 12, or 12_3
        self.require_conf()
        before = record.marked(layout.CANCELLED)
        record.mark(layout.CANCELLED)  # first: a job that ends at once is read as cancelled, not as failed
        try:
            self.slurm.cancel(target)
        except HpcError:
            if not before:  # not cancelled (no answer, or SLURM refused): it runs on, and is not to be taken
                (record.home / layout.CANCELLED).unlink(missing_ok=True)  # for cancelled when it ends
            raise

    def log_tag(self, record: JobRecord, task: str) -> str:
        return task_id(record, task)

    def batch_log(self, record: JobRecord, task: str) -> str:
        return layout.JobFolder.batch_log_name(record.name, self.log_tag(record, task))


def task_id(record: JobRecord, task: str) -> str:
    """How SLURM names a task: ``12`` for a plain job, ``12_3`` for an array's task 3 (squeue, log names)."""
    return f"{record.job_id}_{task}" if record.array is not None else record.job_id


class Facts:
    """What SLURM and the job folders say about some jobs: the input of the decision table."""

    def __init__(self, live: dict[str, tuple[str, str, str]]):
        self.live = live
        self.acct: dict[str, list[tuple[TaskState, float | None]]] = {}
        self.exits: dict[str, dict[str, str]] = {}  # job folder -> task -> tasks/<task>.exit
        self.raw_ids: dict[str, dict[str, str]] | None = None  # set where accounting knows only raw ids

    def accounting_ids(self, record: JobRecord, task: str, asking: bool = False) -> list[str]:
        """The id accounting knows a task by: a plain job's id; an array task's ``A_T`` (slurmdbd, which lists
        them all when ``asking`` for the array's id) or the raw id the job wrote in tasks/<task>.jobid (the
        jobcomp file knows only that)."""
        if record.array is None:
            return [record.job_id]
        if self.raw_ids is None:
            return [record.job_id] if asking else [f"{record.job_id}_{task}"]
        return self.raw_ids.get(record.job_dir, {}).get(task, "").split()[:1]


def _newest_since(rows: list[tuple[TaskState, float | None]], since: float) -> TaskState | None:
    """An older job that had the same id (a reset cluster) is not this one; SLURM's times are whole seconds.
    Rows come in the order SLURM wrote them: of those with the newest start the last one is the job's end (a job
    that shrank has a RESIZING row with the same start as its COMPLETED one)."""
    newest: tuple[float, TaskState] | None = None
    for state, start in rows:
        if start is not None and start < since - 2:
            continue
        if newest is None or (start or 0) >= newest[0]:
            newest = (start or 0, state)
    return newest[1] if newest else None


def decide(record: JobRecord, acct: TaskState | None, own: TaskState | None) -> TaskState:
    """A task squeue no longer shows: accounting, then what the job wrote (tasks/<task>.exit), then the cancel
    marker; never COMPLETED on no evidence."""
    if acct is not None:
        if acct.state == "FAILED" and own is not None:
            return TaskState(acct.state, own.exit_code)  # the script's own code beats SLURM's 0:0 on signals
        return acct
    if own is not None:
        return own
    if record.marked(layout.CANCELLED):
        return TaskState("CANCELLED")
    return TaskState("UNKNOWN", None, "not in squeue, accounting or the job's own record")
