"""SLURM on a cluster reached over SSH: the SLURM backend, its commands and file reads run on the login node.

Submit sends the code snapshot with rsync into the new job folder, hard-linking from the project's last job
what did not change (so a second submit of the same tree sends only the changes), then unpacks the job's own
files and runs sbatch: two round trips. A status is one round trip: squeue, sacct and the job folders' task files in one
shell script. The record stays on this machine, with a copy of what was sent (less the code).
"""

from __future__ import annotations

import io
import re
import shlex
import tarfile
from pathlib import Path, PurePosixPath

from hpc.cluster.backends.base import Placement, Plan, task_files
from hpc.cluster.backends.slurm import Facts, SlurmBackend
from hpc.cluster.records import JobRecord
from hpc.cluster.ssh import REFUSED, Ssh
from hpc.contract import layout
from hpc.contract.validate import to_plain
from hpc.errors import HpcError
from hpc.slurm.commands import (
    ACCOUNTING_FIELDS,
    EPOCH,
    QUEUE_FORMAT,
    ControllerDown,
    Slurm,
    not_answering,
    parse_accounting,
    parse_queue,
    sbatch_job_id,
)

MARK = "@@hpc@@"  # separates the parts of a status probe's answer

# Bash there: the job root judged as sshd judges a path (it and every folder above it, the link's holder too,
# belong to us or root and no one else may write them; a folder above it may be sticky, like /tmp), then the job
# folder made in it, ours alone. Another user who can write the root could swap the job's code before it runs.
PRIVATE_JOB_DIR = r"""
refuse() { echo "REFUSED the job root $1: $2" >&2; exit 4; }
check_chain() {  # check_chain ROOT FOLDER [sticky-ok]: FOLDER and each folder above it (FOLDER sticky: sticky-ok)
    local p=$2 sticky_ok=${3:-} u m me
    me=$(id -u)
    while :; do
        read -r u m <<< "$(stat -L -c '%u %a' -- "$p")" || refuse "$1" "$p cannot be checked"
        [ "$u" = "$me" ] || [ "$u" = 0 ] || refuse "$1" "$p belongs to uid $u, not to you (uid $me) or root"
        if (( 8#$m & 8#022 )) && ! { [ -n "$sticky_ok" ] && (( 8#$m & 8#1000 )); }; then
            refuse "$1" "$p is writable by group or others (mode $m)"
        fi
        sticky_ok=1  # the folders above
        [ "$p" = / ] && return 0
        p=$(dirname -- "$p")
    done
}
private_job_dir() {  # private_job_dir ROOT JOB
    local found=$1
    while [ ! -e "$found" ]; do found=$(dirname -- "$found"); done
    check_chain "$1" "$(cd -P -- "$found" && pwd)" sticky-ok  # nothing is made where someone else could change it
    (umask 077 && mkdir -p -- "$1") || refuse "$1" "it cannot be created"
    check_chain "$1" "$(cd -P -- "$1" && pwd)"
    check_chain "$1" "$(cd -P -- "$(dirname -- "$1")" && pwd)" sticky-ok
    if [ -e "$2" ] || [ -L "$2" ]; then
        [ -d "$2" ] && [ ! -L "$2" ] && [ -O "$2" ] || refuse "$1" "$2 is not a folder of yours"
    else
        mkdir -m 700 -- "$2" || refuse "$1" "$2 cannot be created"
    fi
}
""".replace("REFUSED", REFUSED)


class RemoteFiles:
    """A job folder on the cluster. Reads are SSH round trips, except what a status probe already brought."""

    def __init__(self, ssh: Ssh, root: str):
        self.ssh, self.root = ssh, root.rstrip("/")
        self.known: dict[str, dict[str, str]] | None = None  # rel_dir -> name -> text, from the last probe
        self.result_key: str | None = None  # a function job's, from its record

    def _path(self, rel: str) -> str:
        return shlex.quote(f"{self.root}/{rel}")

    def list(self, rel_dir: str) -> list[str]:
        if self.known is not None and rel_dir in self.known:
            return sorted(self.known[rel_dir])
        proc = self.ssh.shell(f"ls -1A {self._path(rel_dir)} 2>/dev/null || true")
        return sorted(proc.stdout.decode(errors="replace").split("\n")[:-1])

    def read(self, rel: str, offset: int = 0) -> bytes | None:
        folder, _, name = rel.rpartition("/")
        if offset == 0 and self.known is not None and name in self.known.get(folder, {}):
            return self.known[folder][name].encode()
        proc = self.ssh.shell(f"f={self._path(rel)}; [ -f \"$f\" ] || exit 3; tail -c +{offset + 1} \"$f\"",
                              check=False)
        return proc.stdout if proc.returncode == 0 else None

    def read_owned(self, rel: str) -> bytes | None:
        """A file there, read only if it is a plain file of this user's (never through a link); None if absent."""
        proc = self.ssh.shell(f"f={self._path(rel)}; [ -e \"$f\" ] || [ -L \"$f\" ] || exit 3\n"
                              f"[ -f \"$f\" ] && [ ! -L \"$f\" ] && [ -O \"$f\" ] || exit 4; cat -- \"$f\"",
                              check=False)
        if proc.returncode == 4:
            raise HpcError(f"{self.root}/{rel} on {self.ssh.label} is not a file of yours: refused",
                           fix="check who can write the job folder")
        return proc.stdout if proc.returncode == 0 else None

    def read_all(self, rel_dir: str, suffix: str) -> dict[str, str]:
        out = {}
        for name in self.list(rel_dir):
            data = self.read(f"{rel_dir}/{name}") if name.endswith(suffix) else None
            if data is not None:  # a file the job removed meanwhile is simply not there
                out[name[:-len(suffix)]] = data.decode(errors="replace").strip()
        return out


class RemoteSlurmBackend(SlurmBackend):
    needs_snapshot = True

    def __init__(self, remote):
        self.remote = remote
        self.ssh = Ssh(remote)
        super().__init__(Slurm(run=self.ssh.run))
        self._files: dict[str, RemoteFiles] = {}

    def require_conf(self) -> None:
        """The login node has its own SLURM configuration."""

    def accounting_key(self) -> str:
        return f"ssh:{self.ssh.label}"

    # --- placing and sending --------------------------------------------------------------------------
    def new_job(self, job) -> Placement:
        from hpc.cluster import records as jobs

        host = re.sub(r"[^A-Za-z0-9_.@-]", "_", self.ssh.label)
        stage = jobs.new_job_dir(jobs.data_dir().parent / "remote" / host, job.job_name)
        return Placement(Path(PurePosixPath(self.remote.job_root) / stage.name), stage)

    def placeholder(self, job) -> Path:
        from hpc.cluster import records as jobs

        return Path(PurePosixPath(self.remote.job_root) / jobs.placeholder_name(job.job_name))

    def record_fields(self, placement: Placement) -> dict:
        return {"remote": to_plain(self.remote), "record_dir": str(placement.stage)}

    def advise(self, effective) -> None:
        import sys

        super().advise(effective)
        if effective.profile.python is None and self.remote.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"hpc: warning: profile {effective.profile.name} names no python: the job runs {sys.executable} "
                  "on the cluster; set python in the profile", file=sys.stderr)

    def start(self, plan: Plan, placement: Placement) -> tuple[str, dict]:
        job_dir, stage = str(placement.job_dir), placement.stage
        code = stage / layout.CODE
        q = shlex.quote
        prepare = f"{PRIVATE_JOB_DIR}\nprivate_job_dir {q(self.remote.job_root)} {q(job_dir)}"
        # the previous job's code of this project: files that did not change are hard-linked from it, not sent
        last = f"{self.remote.job_root}/.hpc-code/{_project_key(plan)}"
        sent: dict = {}
        if code.is_dir():
            sent = _rsync_stats(self.ssh.rsync(str(code), f"{job_dir}/{layout.CODE}", prepare=prepare,
                                               link_dest=last))
        files = io.BytesIO()
        with tarfile.open(fileobj=files, mode="w") as tar:
            for path in sorted(stage.iterdir()):
                if path.name != layout.CODE:
                    tar.add(path, arcname=path.name)
        script = "\n".join([
            prepare,  # again: a job without code was not rsynced
            f"tar --no-same-owner -x -C {q(job_dir)} || exit 3",
            # sbatch refused it: no job folder stays behind that no record names
            f"{shlex.join(plan.command)} || {{ rc=$?; rm -rf {q(job_dir)}; exit $rc; }}",
            "date +%s",
            *([(f"(umask 077 && mkdir -p {q(last.rsplit('/', 1)[0])}) && "
                f"ln -sfn {q(job_dir + '/' + layout.CODE)} {q(last)}.$$ && mv -T {q(last)}.$$ {q(last)} || true")]
              if code.is_dir() else []),
        ])
        proc = self.ssh.shell(script, input=files.getvalue(), check=False, timeout=120)
        out = proc.stdout.decode(errors="replace").strip().splitlines()
        job_id = sbatch_job_id(proc.returncode, "\n".join(out[:-1]) if proc.returncode == 0 else "\n".join(out),
                               proc.stderr.decode(errors="replace"))
        if code.is_dir():
            import shutil

            shutil.rmtree(code, ignore_errors=True)  # it is on the cluster now; the record keeps what describes it
        details = {"host": self.ssh.label, **sent}
        if out and out[-1].isdigit():
            details["submitted_on_cluster"] = float(out[-1])  # accounting's clock, not this machine's
        return job_id, details

    # --- following ------------------------------------------------------------------------------------
    def files(self, record: JobRecord) -> RemoteFiles:
        if record.job_dir not in self._files:
            self._files[record.job_dir] = RemoteFiles(self.ssh, record.job_dir)
            # the record stays here, not in the job folder: a function's results are checked with its key
            self._files[record.job_dir].result_key = record.result_key
        return self._files[record.job_dir]

    def collect(self, records: list[JobRecord]) -> Facts:
        """squeue, sacct and every job folder's own record (exit codes, raw ids, lost nodes, a hang's verdict)
        in one round trip."""
        source = self._accounting_source()
        ids = shlex.quote(",".join(dict.fromkeys(r.job_id for r in records)))  # checked on load; quoted anyway
        dirs = " ".join(shlex.quote(r.job_dir) for r in records)
        kinds = (layout.TaskFile.EXIT, layout.TaskFile.JOBID, layout.TaskFile.LOST_NODES, layout.TaskFile.REASON)
        # each process's end (which failed first) and the launcher, for `hpc status`'s reasons
        wanted = " ".join([*(f"{layout.TASKS}/*.{k}" for k in kinds), f"{layout.TASKS}/*.{layout.TaskFile.END}.*",
                           f"{layout.HANG}/*/summary.txt", layout.RUNTIME_CONFIG])
        epoch = " ".join(EPOCH)
        if source == "dbd":
            sacct = f"{epoch} sacct -X -n -P -j {ids} -o {ACCOUNTING_FIELDS} 2>/dev/null"
        elif source == "jobcomp":
            raw = (f'raw=$(for d in {dirs}; do cat "$d"/{layout.TASKS}/*.{layout.TaskFile.JOBID} 2>/dev/null; '
                   f'done | cut -d" " -f1 | paste -sd, -)')
            sacct = f'{raw}; {epoch} sacct -c -n -P -j {ids}"${{raw:+,$raw}}" -o {ACCOUNTING_FIELDS} 2>/dev/null'
        else:
            sacct = "true"
        script = "\n".join([
            # squeue's output goes on to ours (fd 3); its errors are kept in a variable, no file
            f"echo {MARK}squeue",
            f"{{ err=$(squeue -h -r -j {ids} -o {shlex.quote(QUEUE_FORMAT)} 2>&1 1>&3); rc=$?; }} 3>&1",
            f"echo \"{MARK}squeue-status $rc $(printf %s \"$err\" | head -c 300 | tr '\\n' ' ')\"",
            f"echo {MARK}sacct; {sacct}",
            f"for d in {dirs}; do echo \"{MARK}dir $d\"; cd \"$d\" 2>/dev/null || continue",
            # one awk per job folder, however many tasks: file name, a tab, each line
            f"  awk '{{ print FILENAME \"\\t\" $0 }}' {wanted} 2>/dev/null",
            "done",
            "true",
        ])
        parts = _split(self.ssh.shell(script, timeout=120).stdout.decode(errors="replace"))
        status = next((k for k in parts if k.startswith("squeue-status ")), "squeue-status 0").split(" ", 2)
        if status[1] != "0" and "Invalid job id" not in "".join(status[2:]):
            if not_answering("".join(status[2:])):  # waits ride this out (hpc.cluster.status.wait)
                raise ControllerDown("".join(status[2:]).strip())
            raise HpcError(f"squeue on {self.ssh.label} failed: {''.join(status[2:]).strip() or status[1]}",
                           fix="check the controller there (scontrol ping)")
        facts = Facts(parse_queue(parts.get("squeue", "")))
        facts.acct = parse_accounting(parts.get("sacct", ""))
        by_dir = {r.job_dir: r for r in records}
        for key, text in parts.items():
            if not key.startswith("dir "):
                continue
            files = self.files(by_dir[key[4:]])
            known: dict[str, dict[str, str]] = {layout.TASKS: {}, layout.HANG: {}}
            for line in text.splitlines():
                rel, _, content = line.partition("\t")
                folder, _, name = rel.rpartition("/")
                entry = known.setdefault(folder, {})
                entry[name] = f"{entry[name]}\n{content}" if name in entry else content
                if folder.startswith(f"{layout.HANG}/"):
                    known[layout.HANG][folder.split("/", 1)[1]] = ""
            files.known = known
        for r in records:  # read from what the probe brought: no further round trip
            facts.exits[r.job_dir] = task_files(self.files(r), layout.TaskFile.EXIT)
            if source != "dbd" and r.array is not None:
                facts.raw_ids = facts.raw_ids or {}
                facts.raw_ids[r.job_dir] = task_files(self.files(r), layout.TaskFile.JOBID)
        return facts


def _split(text: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    key = None
    for line in text.split("\n"):
        if line.startswith(MARK):
            key = line[len(MARK):]
            parts[key] = ""
        elif key is not None:
            parts[key] += line + "\n"
    return parts


def _project_key(plan: Plan) -> str:
    """Names the project (and job name) on the cluster: its last job's code is what the next submit links from."""
    import hashlib

    origin = str(plan.effective.profile_path) + "|" + str(Path.cwd())
    return f"{plan.effective.job.job_name}-{hashlib.sha256(origin.encode()).hexdigest()[:12]}"


def _rsync_stats(text: str) -> dict:
    def number(label: str) -> int:
        match = re.search(rf"{label}: ([\d,]+)", text)
        return int(match.group(1).replace(",", "")) if match else 0

    return {"sent_files": number("Number of regular files transferred"),
            "sent_bytes": number("Total transferred file size"), "files": number("Number of files")}
