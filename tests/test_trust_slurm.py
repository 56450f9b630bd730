"""No false success on the real on-machine SLURM (issue 22): the SLURM controller stops answering (its process
paused with SIGSTOP, as in a hang or a slow restart) just as the job script requeues a job that asked to run
again. The requeue and `hpc wait` both ride it out; the pause always ends in a `finally`. (The same paths without
a cluster, and the requeue that never goes through: tests/test_trust_status.py.)"""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.jobhelpers import hpc, submit

pytestmark = pytest.mark.slurm
# The pause lasts until one of `hpc wait`'s squeue calls has failed (SLURM's clients give up after 2 x MessageTimeout,
# 10 s here), or this long: a fixed pause missed the outage when `hpc wait` started slowly on a loaded machine.
PAUSE_MAX_S = 90

# Attempt 0 waits for the test's go, then asks to run again as a rank does after the warning signal (its
# checkpoint saved, it exits 0). Every attempt notes itself.
PROGRAM = textwrap.dedent("""
    import os, pathlib, time
    here = pathlib.Path(os.environ["TRUST_DIR"])
    attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
    with open(here / "attempts", "a") as f:
        f.write(attempt + "\\n")
    if attempt == "0":
        (here / "started").touch()
        while not (here / "go").exists():
            time.sleep(0.2)
        pathlib.Path(os.environ["HPC_REQUEUE_FILE"]).write_text("USR1\\n")
""")
# The job script's scontrol: the pause starts once the job's step has ended and the script is about to requeue
# (a step that ends during the pause has its completion resent a minute later, which would only slow the test).
SCONTROL = """#!/bin/bash
if [ "$1" = requeue ] && [ ! -e "$TRUST_DIR/paused" ]; then
  touch "$TRUST_DIR/requeueing"
  while [ ! -e "$TRUST_DIR/paused" ]; do sleep 0.1; done
fi
exec {real} "$@"
"""
# `hpc wait`'s squeue: notes each call's exit status, so that the test knows when the outage has been seen.
SQUEUE = """#!/bin/bash
{real} "$@"
status=$?
echo $status >> "$TRUST_DIR/squeue-exits"
exit $status
"""


def _controller_pid(conf: str) -> int:
    return int((Path(conf).parents[1] / "run" / "slurmctld.pid").read_text())


def _wait_for(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_requeue_and_hpc_wait_ride_out_a_controller_that_stops_answering(slurm, tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scontrol").write_text(SCONTROL.format(real=shutil.which("scontrol")))
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    env = {"TRUST_DIR": str(tmp_path), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}  # sbatch passes it on
    info = submit(tmp_path, "-p", "slurm-local", "-N", "1", "--ntasks-per-node", "1", "prog.py", env=env)
    _wait_for("the first attempt", (tmp_path / "started").exists, 60)
    (tmp_path / "wait-bin").mkdir()
    (tmp_path / "wait-bin" / "squeue").write_text(SQUEUE.format(real=shutil.which("squeue")))
    (tmp_path / "wait-bin" / "squeue").chmod(0o755)
    wait_env = {**_hpc_env(tmp_path), "TRUST_DIR": str(tmp_path),
                "PATH": f"{tmp_path / 'wait-bin'}:{os.environ['PATH']}"}
    waiting = subprocess.Popen([sys.executable, "-m", "hpc", "wait", "--timeout", "240", info["job_id"]],
                               cwd=tmp_path, env=wait_env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    (tmp_path / "go").touch()  # the rank asks to run again
    _wait_for("the job script to requeue", (tmp_path / "requeueing").exists, 60)
    controller = _controller_pid(slurm)
    os.kill(controller, signal.SIGSTOP)
    try:
        (tmp_path / "paused").touch()
        _wait_for("a squeue of `hpc wait` to fail", lambda: _a_squeue_failed(tmp_path), PAUSE_MAX_S)
    finally:
        os.kill(controller, signal.SIGCONT)
    out, err = waiting.communicate(timeout=240)
    assert waiting.returncode == 0, out + err
    assert f"{info['job_id']} COMPLETED (exit 0)" in out
    assert err.count("controller not answering") == 1, err
    assert (tmp_path / "attempts").read_text().split() == ["0", "1"]  # requeued, not COMPLETED after attempt 0
    tasks = Path(info["job_dir"]) / "tasks"
    assert (tasks / "0.requeued").read_text().strip() == "1"  # one of hpc's own requeues: max_requeues counts it
    assert not (tasks / "0.reason").exists()
    batch = hpc(tmp_path, "logs", "--batch", info["job_id"], check=True).stdout
    assert f"hpc: requeued SLURM job {info['job_id']} (USR1)" in batch, batch


def _a_squeue_failed(tmp_path: Path) -> bool:
    exits = tmp_path / "squeue-exits"
    return exits.exists() and any(line.strip() != "0" for line in exits.read_text().splitlines())


def _hpc_env(tmp_path: Path) -> dict:
    """What tests.jobhelpers.hpc runs `hpc` with."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HPC_", "SLURM_JOB", "MASTER_", "ACCELERATE_", "FSDP_"))}
    env.update({"XDG_CONFIG_HOME": str(tmp_path / "xdg-config"), "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
                "HF_HOME": str(tmp_path / "hf")})
    return env


ENDS = textwrap.dedent("""
    import os, pathlib, sys, time
    if os.environ.get("ASK_REQUEUE"):  # as a rank does after the warning signal, its checkpoint saved
        pathlib.Path(os.environ["HPC_REQUEUE_FILE"]).write_text("USR1\\n")
    elif os.environ["RANK"] == "1":
        time.sleep(1)
        sys.exit(3)  # a rank that raises; srun then stops rank 0
    else:
        time.sleep(60)
""")


def test_hpc_wait_says_which_rank_failed_first_and_why_a_job_was_not_requeued(slurm, tmp_path):
    """Two ends that used to read wrong: a rank that raises (the job was FAILED with the exit 143 of the peers
    srun stopped), and a requeue SLURM refuses (the job was COMPLETED: its ranks had saved and exited 0)."""
    (tmp_path / "ends.py").write_text(ENDS)
    (tmp_path / "no-requeue.yaml").write_text("extends: slurm-local\npreemption:\n  requeue: false\n")
    crash = submit(tmp_path, "-p", "slurm-local", "-N", "1", "--ntasks-per-node", "2", "ends.py")
    refused = submit(tmp_path, "-p", "./no-requeue.yaml", "-N", "1", "--ntasks-per-node", "1", "ends.py",
                     env={"ASK_REQUEUE": "1"})
    proc = hpc(tmp_path, "wait", crash["job_id"], timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"{crash['job_id']} FAILED (exit 3)" in proc.stdout
    assert "why: rank 1 on node" in proc.stdout and "failed first (exit 3)" in proc.stdout, proc.stdout
    proc = hpc(tmp_path, "wait", refused["job_id"], timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"why: asked to run again (USR1), but the requeue did not go through: Requested operation is "
            f"presently disabled for job {refused['job_id']}") in proc.stdout, proc.stdout
