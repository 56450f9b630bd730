"""The only code that runs SLURM's commands (sbatch, squeue, sacct, scancel, scontrol, sinfo).

Everything goes through ``Slurm.run``, one seam that recorded-output tests replace.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from hpc.errors import HpcError
from hpc.slurm import array_spec, formats

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}

# How SLURM's clients say that the controller did not answer (slurm_strerror's wording, stable for years): the
# question was never answered, so its failure says nothing about the job, the partition or the request.
NOT_ANSWERING = ("Unable to contact slurm controller", "Socket timed out on send/recv", "Zero Bytes were transmitted",
                 "Communication connection failure", "backup controller in standby mode", "Connection refused",
                 "Connection timed out")


class ControllerDown(HpcError):
    """The SLURM controller did not answer: ask again later (the job itself may well be running)."""

    def __init__(self, message: str):
        super().__init__(f"the SLURM controller does not answer: {message}",
                         fix="try again in a while; `scontrol ping` says when it is back")
        self.slurm_message = message


def not_answering(message: str) -> bool:
    return any(phrase in message for phrase in NOT_ANSWERING)


def _message(proc) -> str:
    return " ".join((proc.stderr or proc.stdout or "").split()) or f"exit code {proc.returncode}"


def _run(argv: Sequence[str]) -> "subprocess.CompletedProcess[str]":
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise HpcError(f"{argv[0]} not found: this machine has no SLURM client",
                       fix="run on a login node, or use --profile local") from None
    except subprocess.TimeoutExpired:
        raise ControllerDown(f"{argv[0]} got no answer within 60 s") from None


@dataclass
class QosInfo:
    name: str
    preempts: tuple[str, ...]  # the QOS whose jobs this one's jobs preempt
    preempt_mode: str  # "cluster": the cluster's PreemptMode
    grace_time: int | None


@dataclass
class TaskState:
    state: str
    exit_code: int | None = None
    reason: str = ""

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


class Slurm:
    # A one-off question (the partition checks before a submit, whether a job was preempted) that the controller
    # left unanswered is asked again after these waits: a busy controller drops some of its clients for a moment
    # (each try may itself take SLURM's MessageTimeout). The state questions (squeue, sacct) are not: `hpc wait`
    # and `hpc status` ride out an outage themselves and say so (hpc.cluster.status.Outage). Requests that change
    # something (sbatch, scancel, requeue) are never repeated: the first may have been carried out although its
    # answer was lost.
    RETRY_WAITS_S = (1.0, 3.0)

    def __init__(self, run: Runner = _run, retry_waits: Sequence[float] | None = None):
        self.run = run
        self.retry_waits = tuple(self.RETRY_WAITS_S if retry_waits is None else retry_waits)

    def _ask(self, argv: Sequence[str]) -> "subprocess.CompletedProcess[str]":
        """Run a question; asked again while the controller does not answer (the last answer is returned)."""
        proc = self.run(argv)
        for wait in self.retry_waits:
            if proc.returncode == 0 or not not_answering(_message(proc)):
                break
            time.sleep(wait)
            proc = self.run(argv)
        return proc

    def _ok(self, argv: Sequence[str]) -> str:
        proc = self.run(argv)
        if proc.returncode != 0:
            raise self._failure(argv, proc)
        return proc.stdout

    @staticmethod
    def _failure(argv: Sequence[str], proc) -> HpcError:
        """A failed command as the error to raise: the controller not answering, or SLURM's own answer."""
        message = _message(proc)
        if not_answering(message):
            return ControllerDown(message)
        return HpcError(f"{argv[0]} failed: {message}", fix="see SLURM's message")

    def submit_argv(self, argv: Sequence[str]) -> str:
        """Run a plan's ``sbatch --parsable ...`` -> the job id."""
        proc = self.run(argv)
        if proc.returncode != 0 and not_answering(_message(proc)):
            raise ControllerDown(_message(proc))
        return sbatch_job_id(proc.returncode, proc.stdout, proc.stderr)

    def queue(self, job_ids: str) -> dict[str, tuple[str, str, str]]:
        """Live jobs and array tasks of any number of jobs (``"12,15"``), in one call:
        ``12`` or ``15_3`` -> (state, raw job id, reason)."""
        proc = self.run(["squeue", "-h", "-r", "-j", job_ids, "-o", QUEUE_FORMAT])
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return {}  # finished and forgotten
            raise self._failure(["squeue"], proc)
        return parse_queue(proc.stdout)

    def accounting_source(self) -> str | None:
        """Where finished jobs are kept: 'dbd' (slurmdbd), 'jobcomp' (the job completion file), 'none'."""
        proc = self.run(["scontrol", "show", "config"])
        if proc.returncode != 0:
            return None
        conf = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in proc.stdout.splitlines())}
        if conf.get("AccountingStorageType", "accounting_storage/none") != "accounting_storage/none":
            return "dbd"
        if conf.get("JobCompType", "jobcomp/none") == "jobcomp/filetxt":
            return "jobcomp"
        return "none"

    def accounting_many(self, ids: Sequence[str], source: str | None = None
                        ) -> dict[str, list[tuple[TaskState, float | None]]]:
        """Finished jobs (plain ids, raw ids or ``A_T``) in one call: id -> [(state, start time)], a row per job
        that had the id. ``source`` None: slurmdbd, else the jobcomp file."""
        if source == "none" or not ids:
            return {}
        out = self._sacct(["-n", "-P", "-j", ",".join(ids), "-o", ACCOUNTING_FIELDS], source)
        return parse_accounting(out) if out is not None else {}

    def _sacct(self, fields: list[str], source: str | None) -> str | None:
        """sacct's output from slurmdbd (-X) or, with ``source`` "jobcomp" or when slurmdbd answers nothing, the
        jobcomp file (-c); None when neither answered."""
        proc = None
        if source in (None, "dbd"):
            proc = self.run([*EPOCH, "sacct", "-X", *fields])
        if source == "jobcomp" or source is None and (proc.returncode != 0 or not proc.stdout.strip()):
            proc = self.run([*EPOCH, "sacct", "-c", *fields])
        return proc.stdout if proc is not None and proc.returncode == 0 else None

    def attempts(self, ids: Sequence[str], source: str | None = None) -> dict[str, list[dict[str, str]]]:
        """Every run of some jobs (plain ids, raw ids or ``A_T``), a requeued job's earlier attempts included
        (``-D``; the jobcomp file has a row per run anyway): id -> rows of ATTEMPT_FIELDS in SLURM's order,
        times in epoch seconds. ``source`` as for accounting_many; nothing known: {}."""
        if source == "none" or not ids:
            return {}
        text = self._sacct(["-D", "-n", "-P", "-j", ",".join(ids), "-o", ",".join(ATTEMPT_FIELDS)], source)
        if text is None:
            return {}
        out: dict[str, list[dict[str, str]]] = {}
        for row in parse_fields(text, ATTEMPT_FIELDS):
            for ident in dict.fromkeys((row["JobID"], row["JobIDRaw"])):
                out.setdefault(ident, []).append(row)
        return out

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        argv = ["scancel"] + ([f"--signal={signal}", "--batch"] if signal else []) + [job_id]
        self._ok(argv)

    def requeue(self, job_id: str) -> None:
        self._ok(["scontrol", "requeue", job_id])

    def preempted(self, job_id: str) -> bool:
        """Whether a running job was chosen for preemption (``PreemptTime`` set; SLURM 20.11+)."""
        proc = self._ask(["scontrol", "show", "job", "-o", job_id])
        fields = dict(item.split("=", 1) for item in proc.stdout.split() if "=" in item) if proc.returncode == 0 else {}
        return fields.get("JobState") == "RUNNING" and fields.get("PreemptTime", "None") not in ("None", "Unknown")

    def partition(self, name: str | None) -> dict[str, str] | None:
        """``scontrol show partition NAME -o`` as a dict (the default partition when NAME is None)."""
        proc = self._ask(["scontrol", "show", "partition", "-o"] + ([name] if name else []))
        if proc.returncode != 0:
            if "not found" in _message(proc):
                return None
            raise self._failure(["scontrol"], proc)  # an unanswered question is no "does not exist"
        for line in proc.stdout.splitlines():
            info = dict(item.split("=", 1) for item in line.split() if "=" in item)
            if name is None and "Default=YES" not in line:
                continue
            return info
        return None

    def partition_gres(self, name: str) -> str:
        proc = self._ask(["sinfo", "-h", "-p", name, "-o", "%G"])
        if proc.returncode != 0:
            raise self._failure(["sinfo"], proc)
        return proc.stdout.strip()

    # --- what the cluster says about itself (hpc profile new --detect, hpc profile check) ---------------------
    def show_records(self, kind: str) -> list[dict[str, str]]:
        """``scontrol show partition|node -o``: one dict per partition or node."""
        proc = self._ask(["scontrol", "show", kind, "-o"])
        if proc.returncode != 0:
            raise self._failure(["scontrol"], proc)
        return parse_records(proc.stdout)

    def config(self) -> dict[str, str]:
        """``scontrol show config``: slurm.conf as the controller runs it."""
        proc = self._ask(["scontrol", "show", "config"])
        if proc.returncode != 0:
            raise self._failure(["scontrol"], proc)
        return parse_config(proc.stdout)

    def associations(self, user: str) -> list[dict[str, str]] | None:
        """The user's associations (account, partition, QOS, default QOS) from slurmdbd; None where there is no
        slurmdbd to ask (``sacctmgr`` answers only with accounting_storage/slurmdbd) or it does not answer."""
        proc = self._ask(["sacctmgr", "-n", "-P", "show", "associations", "where", f"user={user}",
                          "format=Account,Partition,QOS,DefaultQOS"])
        if proc.returncode != 0:
            return None
        return parse_fields(proc.stdout, ("account", "partition", "qos", "default_qos"))

    def default_account(self, user: str) -> str | None:
        proc = self._ask(["sacctmgr", "-n", "-P", "show", "user", user, "format=DefaultAccount"])
        if proc.returncode != 0:
            return None
        return next((line.strip() for line in proc.stdout.splitlines() if line.strip()), None)

    def qos(self) -> list[QosInfo] | None:
        """Every QOS with what it preempts, its PreemptMode and GraceTime, from slurmdbd; None where it does not
        answer."""
        proc = self._ask(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,Preempt,PreemptMode,GraceTime"])
        if proc.returncode != 0:
            return None
        return [QosInfo(row["name"], tuple(q for q in row["preempt"].split(",") if q), row["mode"],
                        _seconds(row["grace"]))
                for row in parse_fields(proc.stdout, ("name", "preempt", "mode", "grace")) if row["name"]]

    # Not SLURM's, but asked where its clients run (here, or the login node over SSH) through the same runner:
    # who SLURM sees, and which of that machine's networks the nodes' addresses are on.
    def login_user(self) -> str | None:
        proc = self.run(["id", "-un"])
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def networks(self) -> list[tuple[str, str]] | None:
        """``ip -o addr show``: (interface, address/prefix) of the machine SLURM's clients run on."""
        try:
            proc = self.run(["ip", "-o", "addr", "show"])
        except HpcError:  # no ip command here: a fact unknown, not an error
            return None
        return parse_ip_addresses(proc.stdout) if proc.returncode == 0 else None

    def addresses(self, hosts: Sequence[str]) -> dict[str, str]:
        """Host names -> an address (``getent hosts``); names that do not resolve are left out."""
        try:
            proc = self.run(["getent", "hosts", *hosts])
        except HpcError:
            return {}
        return parse_getent(proc.stdout, hosts)


def sbatch_job_id(returncode: int, stdout: str, stderr: str) -> str:
    """What ``sbatch --parsable`` answered -> the job id (``jobid[;cluster]``: the cluster part is dropped)."""
    if returncode != 0:
        raise HpcError(f"sbatch refused the job: {' '.join((stderr or stdout).split())}",
                       fix="see sbatch's message above")
    job_id = stdout.strip().splitlines()[-1].split(";")[0] if stdout.strip() else ""
    if not job_id.isdigit():
        raise HpcError(f"sbatch printed {stdout.strip()!r}, not a job id", fix="check sbatch --parsable")
    return job_id


def parse_queue(text: str) -> dict[str, tuple[str, str, str]]:
    """``squeue -o %i|%T|%A|%r`` lines -> ``12`` or ``15_3`` -> (state, raw job id, reason)."""
    out = {}
    for line in text.splitlines():
        ident, state, raw, reason = (line.split("|") + ["", "", ""])[:4]
        if ident:
            out[ident] = (state, raw, reason)
    return out


def parse_accounting(text: str) -> dict[str, list[tuple[TaskState, float | None]]]:
    """``sacct -P -o JobID,JobIDRaw,State,ExitCode,Start`` lines -> id (both forms) -> [(state, start time)].
    Array tasks that never started share one row, ``15_[3-9999%8]``: it stands for each of them."""
    out: dict[str, list[tuple[TaskState, float | None]]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5 or not parts[2]:
            continue
        code = parts[3].split(":")[0]
        row = (TaskState(parts[2].split()[0], int(code) if code.isdigit() else None), _timestamp(parts[4]))
        idents = list(dict.fromkeys(parts[:2]))
        pending = re.fullmatch(r"(\d+)_\[([0-9,:%-]+)\]", parts[0])
        if pending:
            idents = [f"{pending.group(1)}_{i}" for i in array_spec.indices(pending.group(2))]
        for ident in idents:
            out.setdefault(ident, []).append(row)
    return out


def _seconds(duration: str) -> int | None:
    """sacctmgr's durations (``00:05:00``, ``1-00:00:00``), 0 included (which sbatch's time limits refuse)."""
    if not duration.strip("0:-"):
        return 0
    try:
        return formats.parse_time(duration)
    except HpcError:
        return None


def parse_records(text: str) -> list[dict[str, str]]:
    """``scontrol show ... -o``: a line per record of ``Key=Value`` words -> a dict each. A value never holds a
    space in one-line output except OS= and Reason= (both free text): the words that follow them without an
    ``=`` belong to them."""
    records = []
    for line in text.splitlines():
        record: dict[str, str] = {}
        key = None
        for word in line.split():
            name, eq, value = word.partition("=")
            if eq and re.fullmatch(r"[A-Za-z][A-Za-z0-9_:/]*", name):
                key, record[name] = name, value
            elif key is not None:
                record[key] += " " + word
        if record:
            records.append(record)
    return records


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Key = Value`` lines -> a dict (the header and blank lines dropped)."""
    conf = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip():
            conf[key.strip()] = value.strip()
    return conf


def parse_fields(text: str, names: Sequence[str]) -> list[dict[str, str]]:
    """``-n -P`` output (``|`` between fields) -> a dict per line, by the names given."""
    rows = []
    for line in text.splitlines():
        if line.strip():
            rows.append(dict(zip(names, (part.strip() for part in (line.split("|") + [""] * len(names))))))
    return rows


def parse_gres(text: str) -> dict[str, tuple[str | None, int]]:
    """A node's ``Gres=`` (``gpu:a100:4(S:0-1),nic:1``) -> name -> (type or None, count), types of one name
    added up (a node with ``gpu:a100:2,gpu:v100:2`` has 4 GPUs, of no one type)."""
    out: dict[str, tuple[str | None, int]] = {}
    for item in re.sub(r"\([^)]*\)", "", text or "").split(","):
        parts = item.strip().split(":")
        if not parts[0] or parts[0] == "(null)":
            continue
        count = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
        kind = parts[1] if len(parts) == 3 else None
        if parts[0] in out:
            old_kind, old = out[parts[0]]
            out[parts[0]] = (old_kind if old_kind == kind else None, old + count)
        else:
            out[parts[0]] = (kind, count)
    return out


def parse_ip_addresses(text: str) -> list[tuple[str, str]]:
    """``ip -o addr show`` lines -> (interface, address/prefix), IPv4 and IPv6."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 4 and words[2] in ("inet", "inet6"):
            out.append((words[1].split("@")[0], words[3]))
    return out


def parse_getent(text: str, hosts: Sequence[str]) -> dict[str, str]:
    """``getent hosts A B ...`` lines (``ADDRESS NAME [ALIASES]``, one per name found) -> name -> address. A line
    is given to the name asked that it lists; one that lists none of them (a DNS name of another spelling) is
    left out rather than guessed."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        for host in hosts:
            if len(words) >= 2 and host not in out and (host in words[1:] or host == words[0]):
                out[host] = words[0]
    return out


QUEUE_FORMAT = "%i|%T|%A|%r"
# times as epoch seconds: a laptop in another time zone than the cluster reads them right
EPOCH = ["env", "SLURM_TIME_FORMAT=%s"]
ACCOUNTING_FIELDS = "JobID,JobIDRaw,State,ExitCode,Start"
# one row per run of a job (hpc report): a requeued job's attempts are rows of their own
ATTEMPT_FIELDS = ("JobID", "JobIDRaw", "State", "Submit", "Start", "End", "NNodes", "NodeList")


def _timestamp(start: str) -> float | None:
    """sacct's Start: epoch seconds (SLURM_TIME_FORMAT=%s, as hpc asks), else ISO in the cluster's local time."""
    import datetime

    if not start or start in ("Unknown", "None"):
        return None
    if start.isdigit():
        return float(start)
    try:
        return datetime.datetime.fromisoformat(start).timestamp()
    except ValueError:
        return None


def check_fits(slurm: Slurm, partition: str | None, nodes: int, time: str, gpus_per_node: int) -> None:
    """Fail at submit, not hours later in the queue, when a partition cannot run the job at all."""
    info = slurm.partition(partition)
    if info is None:
        if partition:
            raise HpcError(f"partition {partition!r} does not exist on this cluster",
                           fix="check `sinfo -s`, or set partition in the profile")
        return
    name = info.get("PartitionName", partition or "default")
    if info.get("State", "UP") not in ("UP",):
        raise HpcError(f"partition {name} is {info['State']}", fix="choose another partition or wait")
    total = info.get("TotalNodes", "")
    if total.isdigit() and nodes > int(total):
        raise HpcError(f"--nodes {nodes} exceeds partition {name}'s {total} nodes", fix=f"ask for at most {total}")
    max_nodes = info.get("MaxNodes", "UNLIMITED")
    if max_nodes.isdigit() and nodes > int(max_nodes):
        raise HpcError(f"--nodes {nodes} exceeds partition {name}'s MaxNodes {max_nodes}",
                       fix=f"ask for at most {max_nodes}")
    max_time = info.get("MaxTime", "UNLIMITED")
    if max_time not in ("UNLIMITED", "INFINITE"):
        limit, asked = formats.parse_time(max_time), formats.parse_time(time)
        if limit is not None and (asked is None or asked > limit):
            raise HpcError(f"--time {time} exceeds partition {name}'s MaxTime {max_time}",
                           fix=f"ask for at most {max_time}")
    if gpus_per_node and "gpu" not in slurm.partition_gres(name):
        raise HpcError(f"partition {name} has no GPUs (GRES) but the job asks for {gpus_per_node} per node",
                       fix="choose a GPU partition, or --gpus-per-node 0")


def require_conf() -> None:
    """SLURM clients without a config look the controller up in DNS: refuse rather than leak traffic."""
    if not os.environ.get("SLURM_CONF") and not os.path.exists("/etc/slurm/slurm.conf") \
            and not os.path.exists("/etc/slurm-llnl/slurm.conf"):
        raise HpcError("no SLURM configuration: SLURM_CONF is unset and /etc/slurm/slurm.conf is missing",
                       fix="export SLURM_CONF=... (for the on-machine cluster: eval \"$(scripts/slurm-local env)\")")
