"""The job folder's names: the one contract between the login side (Python) and the job (Jinja and bash).

    <output_dir>/<name>-<YYYYmmdd-HHMMSS>-<hex>/
        job.sbatch | job.sh, hostfile, runtime.json   what was submitted (hpc.cluster.backends.plan)
        effective.json                                every value and where it came from
        record.json                                   id, scheduler, profile, submit command, snapshot
        code/                                         the code snapshot the job runs from
        function/                                     a function job's signed call, signing key, each rank's result
        sanity/                                       `hpc test`: each rank's check results (hpc.runtime.sanity)
        logs/                                         the batch script's log, one per rank (or node)
        tasks/<task>.<kind>                           what the job writes of each (array) task, see TaskFile
        hang/<task>/                                  the hang watchdog's stacks and verdict
        timings.json                                  the slowest step and the last save (lead-time check)

``JobFolder`` spells every path once. The templates get one rooted at ``$HPC_JOB_DIR`` with ``$task`` for the
task, so bash expands the same names that Python reads. Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

RECORD = "record.json"
EFFECTIVE = "effective.json"
RUNTIME_CONFIG = "runtime.json"
RUNTIME_CONFIG_ENV = "HPC_RUNTIME_CONFIG"
HOSTFILE = "hostfile"
CODE = "code"
LOGS = "logs"
TASKS = "tasks"
HANG = "hang"
TIMINGS = "timings.json"
FUNCTION = "function"
SANITY = "sanity"
VETTING = "vetting"  # vetting/<task>/<attempt>/<node>.json: each node's checks before the ranks start
CANCELLED = "cancelled"  # marker: the user cancelled the job (an ended job without accounting stays CANCELLED)

# the rendezvous port follows from the job id, above Linux's ephemeral range (32768-60999)
PORT_BASE = 61000
PORT_SPAN = 4536  # 61000 + 4535 = 65535

# one line per node of a hostfile, by the profile's hostfile_format
HOSTFILE_LINE = {"deepspeed": "{host} slots={slots}", "mpi": "{host}:{slots}"}


class TaskFile:
    """What the job writes of a task, as ``tasks/<task>.<kind>``."""

    EXIT = "exit"  # the batch script's exit code
    JOBID = "jobid"  # "<SLURM job id> <restart count>": array tasks' raw ids, for accounting
    STOP = "stop"  # the signal the batch shell got (read by ranks whose launcher does not pass it on)
    REQUEUE = "requeue"  # why a rank asked to run again; the batch script requeues once the step has ended
    END = "end"  # end.<node>.<rank>: how each task's program ended (a lost node notes nothing)
    RANK_SHIM = "deepspeed.py"  # the script DeepSpeed's slurm runner starts as each rank (deepspeed.sbatch.j2)
    LOST_NODES = "lost_nodes"  # nodes that stopped answering, a line per loss
    # "<lost> by <spare>[, ...]" a line per loss a hot spare took the place of (the step ran again in the attempt)
    REPLACED = "replaced"
    SAVES = "saves"  # a self-resuming script's checkpoints, a JSON line each (hpc/runtime/checkpoint/script_resume.py)
    # how often hpc itself requeued the task (the warning signal, a hang, a lost node), one number written whole:
    # max_requeues counts these only, never SLURM's own requeues for preemption (SLURM_RESTART_COUNT counts both)
    REQUEUED = "requeued"
    REASON = "reason"  # why the attempt ended without its work done (not requeued, a failed requeue), a line each
    # a batch-inference task's items: "items" {"attempt", "done", "total"} at the attempt's start (rank 0), and
    # "items-r<rank>" "<attempt> <n>": what each rank committed since (hpc.contract.batch_outputs)
    ITEMS = "items"
    # nodes a later attempt must not run on besides the lost ones: "<node> <why>" a line each (vetting found it
    # bad, a straggler with straggler_action requeue); the job script's requeue excludes them with the lost nodes
    EXCLUDED = "excluded"
    STRAGGLERS = "stragglers"  # a JSON line per straggler named (rank, host, ratio, step)
    PROGRESS = "progress"  # "<attempt> <step or items>" a line per checkpoint or chunk committed (progress_guard)
    NOTIFIED = "notified"  # the notices already sent, a key each: each goes out once (hpc.runtime.resilience.notify)
    TIMELINE = "timeline"  # what each attempt did and when, a JSON line per event (hpc.contract.timeline)


class JobFolder:
    def __init__(self, root: str | Path):
        self.root = str(root)

    def _join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def file(self, name: str) -> str:
        return self._join(name)

    def logs(self) -> str:
        return self._join(LOGS)

    def tasks(self) -> str:
        return self._join(TASKS)

    def task(self, task: str, kind: str) -> str:
        return self._join(TASKS, f"{task}.{kind}")

    def hang(self, task: str) -> str:
        return self._join(HANG, task)

    def vetting(self, task: str) -> str:
        return self._join(VETTING, task)

    def function(self, name: str) -> str:
        return self._join(FUNCTION, name)

    # logs/: sbatch's own file for the batch script (%x-%j, %x-%A_%a for arrays), and one per rank or node
    @staticmethod
    def batch_log_pattern(array: bool) -> str:
        return "%x-%A_%a.out" if array else "%x-%j.out"

    @staticmethod
    def batch_log_name(job_name: str, tag: str) -> str:
        return f"{job_name}-{tag}.out"

    @staticmethod
    def rank_log_name(rank: str, tag: str) -> str:
        return f"rank{rank}-{tag}.out"

    @staticmethod
    def node_log_name(node: str, tag: str) -> str:
        return f"node{node}-{tag}.out"


def this_task_file(kind: str) -> str | None:
    """tasks/<task>.<kind> of the job folder this process runs in ($HPC_JOB_DIR, $HPC_TASK); None outside a job."""
    job_dir = os.environ.get("HPC_JOB_DIR")
    return JobFolder(job_dir).task(os.environ.get("HPC_TASK", "0"), kind) if job_dir else None


# a function job's files under function/
FUNCTION_CALL = "call.pkl"
FUNCTION_KEY = "key"  # the key the job signs its pickles with: its owner's alone (0600), checked by the job


def function_result(rank: int | str) -> str:
    return f"result-{rank}.pkl"


def sanity_result(rank: int, host: str, pid: int) -> str:
    """Host and pid in the name: two processes that both think they are rank 0 leave two files, not one."""
    return f"rank{rank}-{host}-{pid}.json"


def port_formula(job_id_expr: str) -> str:
    """The port as a bash arithmetic expression over the job id (``port_for`` in Python)."""
    return f"$(( {job_id_expr} % {PORT_SPAN} + {PORT_BASE} ))"


def next_port_formula(port_expr: str) -> str:
    """The port after ``port_expr`` in hpc's range, wrapping around (the vetting step's rendezvous)."""
    return f"$(( ({port_expr} - {PORT_BASE} + 1) % {PORT_SPAN} + {PORT_BASE} ))"


def hostfile_text(hosts: list[str], slots: int, fmt: str) -> str:
    return "".join(HOSTFILE_LINE[fmt].format(host=h, slots=slots) + "\n" for h in hosts)


def hostfile_suffix(slots: int, fmt: str) -> str:
    """What follows the host name on a hostfile line: the job appends it to `scontrol show hostnames`."""
    return HOSTFILE_LINE[fmt].format(host="", slots=slots)
