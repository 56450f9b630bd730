"""hpc from a laptop: every command through the SSH login node of scripts/slurm-local (SLURM_LOCAL_SSH=1), run
in a mount namespace where SLURM's commands are masked and SLURM_CONF is unset, so nothing reaches SLURM but
over SSH."""

import json
import os
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import SLURM_LOCAL

pytestmark = pytest.mark.slurm
SLURM_COMMANDS = "sbatch squeue sacct scancel scontrol sinfo srun salloc sacctmgr sstat"
MASK = textwrap.dedent("""\
    stub=$1; shift
    for c in %s; do p=$(command -v "$c") && mount --bind "$stub" "$p"; done
    unset SLURM_CONF
    exec "$@"
    """ % SLURM_COMMANDS)
HELLO = textwrap.dedent("""\
    import os, socket, sys, time
    print("hello from rank", os.environ["RANK"], "on", socket.gethostname(), "args", sys.argv[1:], flush=True)
    time.sleep(float(sys.argv[2]) if sys.argv[1:2] == ["--nap"] else 0)
    """)


@pytest.fixture(scope="module")
def login(slurm, tmp_path_factory):
    """The login node, and a stand-in that every masked SLURM command runs instead."""
    proc = subprocess.run([str(SLURM_LOCAL), "up"], env={**os.environ, "SLURM_LOCAL_SSH": "1"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stub = tmp_path_factory.mktemp("mask") / "no-slurm-here"
    stub.write_text("#!/bin/sh\necho \"$0: SLURM is masked: this test reaches it over SSH only\" >&2\nexit 97\n")
    stub.chmod(0o755)
    return stub


@pytest.fixture
def project(login, tmp_path):
    """The code, in a folder of its own: hpc's records (XDG folders beside it) are not part of its snapshot."""
    code = tmp_path / "project"
    code.mkdir()
    (code / "hello.py").write_text(HELLO)
    return code


def masked(login, project: Path, *argv, timeout=180, env=None) -> subprocess.CompletedProcess:
    """Run argv where SLURM's commands are masked (a private mount namespace) and SLURM_CONF is unset."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_", "SLURM_"))}
    home = project.parent
    full.update({"XDG_DATA_HOME": str(home / "xdg-data"), "XDG_CONFIG_HOME": str(home / "xdg-config"),
                 "XDG_CACHE_HOME": str(home / "xdg-cache"), **(env or {})})
    return subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", MASK, "mask", str(login),
                           *argv], cwd=project, env=full, capture_output=True, text=True, timeout=timeout)


def hpc(login, project, *args, **kw) -> subprocess.CompletedProcess:
    return masked(login, project, sys.executable, "-m", "hpc", *args, **kw)


def record(project: Path, job_id: str) -> dict:
    index = project.parent / "xdg-data" / "hpc" / "jobs"
    entry = json.loads(next(index.glob(f"{job_id}--*.json")).read_text())
    return json.loads((Path(entry["job_dir"]) / "record.json").read_text())


def test_slurm_is_really_masked(login, project):
    proc = masked(login, project, "bash", "-c", 'squeue; echo "rc=$? conf=${SLURM_CONF:-unset}"')
    assert "SLURM is masked" in proc.stderr and "rc=97 conf=unset" in proc.stdout


def test_submit_logs_status_list_wait_over_ssh_and_a_resubmit_sends_only_what_changed(login, project):
    first = hpc(login, project, "submit", "--json", "-p", "slurm-local-ssh", "-N", "2", "--ntasks-per-node", "1",
                "hello.py", "--", "it's $HOME")
    assert first.returncode == 0, first.stderr
    job = json.loads(first.stdout)
    follow = hpc(login, project, "logs", "-f", "--all", job["job_id"])  # streams until the job ends
    assert follow.returncode == 0, follow.stderr
    lines = sorted(line for line in follow.stdout.splitlines() if "hello from rank" in line)
    assert lines == [f"[rank{r}] hello from rank {r} on node{r + 1} args [\"it's $HOME\"]"
                     for r in (0, 1)], follow.stdout
    wait = hpc(login, project, "wait", job["job_id"])
    assert wait.returncode == 0 and "COMPLETED" in wait.stdout, wait.stdout + wait.stderr
    status = json.loads(hpc(login, project, "status", "--json", job["job_id"]).stdout)
    assert (status["state"], status["exit_code"], status["job_dir"]) == ("COMPLETED", 0, job["job_dir"])
    # the report over SSH: sacct's one run of 2 nodes, no hpc runtime in it (all of it unrecorded)
    report = json.loads(hpc(login, project, "report", "--json", job["job_id"]).stdout)
    (a,) = report["tasks"][0]["attempts"]
    assert (a["reason"], a["nodes"], a["hosts"]) == ("COMPLETED", 2, ["node1", "node2"]), a
    assert a["phases_s"]["unrecorded"] == a["seconds"]
    assert job["job_dir"].startswith("/tmp/hpc-slurm/remote-jobs/")  # the folder is on the cluster ...
    saved = record(project, job["job_id"])
    assert saved["remote"]["port"] == 2222 and Path(saved["record_dir"]).is_relative_to(project.parent / "xdg-data")
    assert saved["local"]["sent_files"] == 1  # ... the record here: hello.py went over

    (project / "more.py").write_text("x = 1\n")  # a second submit of the same tree, one file more
    second = hpc(login, project, "submit", "--json", "-p", "slurm-local-ssh", "--ntasks-per-node", "1",
                 "hello.py")
    assert second.returncode == 0, second.stderr
    again = record(project, json.loads(second.stdout)["job_id"])
    assert again["local"]["sent_files"] == 1 and again["local"]["files"] >= 2  # only the new file went
    listed = json.loads(hpc(login, project, "list", "--json").stdout)
    assert [r["job_id"] for r in listed] == [json.loads(second.stdout)["job_id"], job["job_id"]]
    assert hpc(login, project, "wait", json.loads(second.stdout)["job_id"]).returncode == 0


CHATTY = """name: chatty
extends: slurm-local
remote:
  host: 127.0.0.1
  port: 2222
  user: root
  identity_file: /tmp/hpc-slurm/ssh/id_ed25519
  known_hosts: /tmp/hpc-slurm/ssh/known_hosts
  job_root: /tmp/hpc-slurm/remote-jobs
  env: ["echo 'Welcome to the cluster! 12345'", "echo 'job 777 module loaded' >&2"]
"""


def test_cancel_over_ssh_from_a_login_node_that_talks(login, project):
    """A login shell that prints (banners, module messages) cannot be taken for SLURM's or a file's words."""
    (project / "chatty.yaml").write_text(CHATTY)
    proc = hpc(login, project, "submit", "--json", "-p", "./chatty.yaml", "--ntasks-per-node", "1",
               "hello.py", "--", "--nap", "300")
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(proc.stdout)["job_id"]
    deadline = time.monotonic() + 60
    while json.loads(hpc(login, project, "status", "--json", job_id).stdout)["state"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert hpc(login, project, "cancel", job_id).returncode == 0
    wait = hpc(login, project, "wait", job_id, "--timeout", "60")
    assert wait.returncode != 0 and "CANCELLED" in wait.stdout, wait.stdout + wait.stderr


def test_a_function_travels_and_its_result_comes_back(login, project):
    (project / "fns.py").write_text("import os, socket\n\ndef where(x):\n"
                                    "    return x, os.environ['RANK'], socket.gethostname()\n")
    (project / "drive.py").write_text(textwrap.dedent("""\
        import json, hpc, fns
        job = hpc.submit(fns.where, 5, profile="slurm-local-ssh", nodes=2, ntasks_per_node=1)
        print(json.dumps(job.results(timeout=180)))
        """))
    proc = masked(login, project, sys.executable, "drive.py")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [[5, "0", "node1"], [5, "1", "node2"]]


@pytest.mark.parametrize("change,message", [
    ("port: 2299", "unreachable"),  # nothing listens there
    ("known_hosts: /dev/null", "host key is unknown"),
    ("identity_file: {stranger}", "refused the key"),
])
def test_ssh_failures_are_one_line_errors_never_a_prompt(login, project, change, message):
    stranger = project / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    key, value = change.format(stranger=stranger).split(": ")
    remote = {"host": "127.0.0.1", "port": 2222, "user": "root", "identity_file": "/tmp/hpc-slurm/ssh/id_ed25519",
              "known_hosts": "/tmp/hpc-slurm/ssh/known_hosts", "job_root": "/tmp/hpc-slurm/remote-jobs",
              "connect_timeout": 5, key: int(value) if value.isdigit() else value}
    lines = "".join(f"  {k}: {v}\n" for k, v in remote.items())
    (project / "broken.yaml").write_text(f"name: broken\nextends: slurm-local\nremote:\n{lines}")
    started = time.monotonic()
    proc = hpc(login, project, "submit", "-p", "./broken.yaml", "hello.py", timeout=60)
    assert proc.returncode == 2 and message in proc.stderr and "fix:" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and time.monotonic() - started < 30
    assert not list((project.parent / "xdg-data").glob("hpc/remote/*/*"))  # nothing half-submitted stays behind


def test_a_dry_run_of_a_remote_profile_needs_no_connection(login, project):
    """Rendered here, sent nowhere: it works with the login node out of reach."""
    (project / "away.yaml").write_text(CHATTY.replace("name: chatty", "name: away").replace("port: 2222", "port: 2299"))
    proc = hpc(login, project, "submit", "--dry-run", "--json", "-p", "./away.yaml", "-N", "2", "hello.py")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["job_dir"].startswith("/tmp/hpc-slurm/remote-jobs/hello-") and plan["command"][0] == "sbatch"
    assert f"export HPC_JOB_DIR={plan['job_dir']}" in plan["script"]


def test_a_login_node_that_never_answers_is_a_one_line_timeout_not_a_hang(login, project):
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does) and never says a word
    port = silent.getsockname()[1]
    profile = CHATTY.replace("name: chatty", "name: silent").replace("port: 2222", f"port: {port}")
    (project / "silent.yaml").write_text(profile.replace("  env:", "  connect_timeout: 2\n  env:"))
    started = time.monotonic()
    proc = hpc(login, project, "submit", "-p", "./silent.yaml", "hello.py", timeout=60)
    silent.close()
    assert proc.returncode == 2 and "unreachable" in proc.stderr and "timed out" in proc.stderr, proc.stderr
    assert time.monotonic() - started < 20


def test_the_login_node_runs_with_strict_modes_and_fresh_keys(login):
    """start_login in a mount namespace with /tmp and /run of its own, on a free port: sshd (StrictModes yes)
    lets the fresh key in, and refuses it once authorized_keys is writable by others. (With the login fixture:
    slurm-local with SLURM_LOCAL_SSH=1 installs sshd.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ssh = ('ssh -o BatchMode=yes -o UserKnownHostsFile="$SSH_DIR/known_hosts" -o StrictHostKeyChecking=yes '
           f'-i "$SSH_DIR/id_ed25519" -p {port} root@127.0.0.1')
    script = textwrap.dedent(f"""\
        exec 3< {shlex.quote(str(SLURM_LOCAL))}  # before /tmp, where a checkout may be, is mounted over
        mount -t tmpfs -o mode=1777 tmpfs /tmp && mount -t tmpfs -o mode=0755 tmpfs /run || exit 9
        export SLURM_LOCAL_DIR=/tmp/hpc-slurm-login-test SLURM_LOCAL_SSH=1 SLURM_LOCAL_SSH_PORT={port}
        source /dev/fd/3
        secure_base && mkdir -p "$RUN" "$LOG"
        trap '[ -s "$RUN/sshd.pid" ] && kill "$(cat "$RUN/sshd.pid")"' EXIT
        start_login >/dev/null
        grep -qx "StrictModes yes" "$SSHD_DIR/sshd_config" && echo strict
        {ssh} 'echo "in as $(id -un)"'
        chmod 0666 "$SSHD_DIR/authorized_keys"
        {ssh} true 2>/dev/null || echo "refused when others may write"
        """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_LOCAL")}
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script], check=False,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines() == ["strict", "in as root", "refused when others may write"], proc.stderr
