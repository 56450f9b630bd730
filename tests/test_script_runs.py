"""Rendered scripts run under bash: arguments arrive byte for byte, ranks and rendezvous are right,
signals reach the job step, a failing rank stops the rest. `srun`/`scontrol` are small stubs here;
the real-SLURM tests run the same scripts on the on-machine cluster."""

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

from hpc.cluster import backends
from hpc.cluster.config import precedence as p

TRICKY = ["--lr", "3e-4", "it's $(touch PWNED) `touch PWNED2`", 'say "hi"; exit 1', "tab\there", "*", "$HOME",
          "", "ünïcode", "back\\slash", "--", "-n"]

DUMP = textwrap.dedent("""
    import json, os, sys
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
            "HPC_RUNTIME_CONFIG", "GREETING"]
    out = {"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}
    with open(os.path.join(os.environ["DUMP_DIR"], "rank%s.json" % os.environ["RANK"]), "w") as f:
        json.dump(out, f)
    if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
        sys.exit(3)
    if os.environ.get("HANG_RANK") == os.environ["RANK"]:
        import time; time.sleep(600)
""")

# Emulates `srun` inside a 2-node allocation: one process per task with its SLURM_* variables.
SRUN_STUB = textwrap.dedent("""\
    #!/bin/bash
    while [[ "$1" == --* ]]; do shift; done
    n=$((SLURM_NNODES * SLURM_NTASKS_PER_NODE)); pids=()
    for ((t = 0; t < n; t++)); do
      SLURM_PROCID=$t SLURM_LOCALID=$((t % SLURM_NTASKS_PER_NODE)) SLURM_NODEID=$((t / SLURM_NTASKS_PER_NODE)) "$@" &
      pids+=($!)
    done
    rc=0; for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done; exit $rc
""")
# a controller that answers: the batch script asks it again while it does not (see _wait_step_slurm.j2)
SCONTROL_STUB = """#!/bin/bash
case "$1 $2" in
  "show hostnames") printf 'node1\\nnode2\\n' ;;
  "show job") echo "JobId=$3 JobState=RUNNING PreemptTime=None" ;;
  "ping ") echo "Slurmctld(primary) at node1 is UP" ;;
  *) exit 1 ;;
esac
"""


def stubs(tmp: Path, srun: str = SRUN_STUB) -> dict:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, text in {"srun": srun, "scontrol": SCONTROL_STUB}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def make_job(tmp: Path, profile: str, flags: dict) -> Path:
    (tmp / "dump.py").write_text(DUMP)
    eff = p.resolve(profile, [p.flag_layer({"script": str(tmp / "dump.py"), **flags})])
    plan = backends.for_profile(eff.profile).plan(eff, tmp / "job")
    plan.materialize()
    return tmp / "job" / plan.script_name


def ranks(dump_dir: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(dump_dir.glob("rank*.json"))]


def run_env(tmp, extra):
    (tmp / "dumps").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPC_", "MASTER_"))}
    return {**env, "DUMP_DIR": str(tmp / "dumps"), **extra}


def test_srun_script_passes_arguments_byte_for_byte_and_sets_ranks(in_tmp):
    script = make_job(in_tmp, "slurm-local", {"nodes": 2, "args": TRICKY})
    env = run_env(in_tmp, {**stubs(in_tmp), "SLURM_JOB_ID": "987654", "SLURM_JOB_NODELIST": "node[1-2]",
                           "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "2"})
    proc = subprocess.run(["bash", str(script)], env=env, cwd=in_tmp, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = ranks(in_tmp / "dumps")
    assert [r["argv"] for r in got] == [TRICKY] * 4
    assert [(r["env"]["RANK"], r["env"]["LOCAL_RANK"], r["env"]["NODE_RANK"]) for r in got] == [
        ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")]
    port = str(987654 % 4536 + 61000)
    assert {(r["env"]["WORLD_SIZE"], r["env"]["LOCAL_WORLD_SIZE"], r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"])
            for r in got} == {("4", "2", "node1", port)}
    assert got[0]["env"]["HPC_RUNTIME_CONFIG"] == str(in_tmp / "job" / "runtime.json")
    assert not list(in_tmp.glob("PWNED*")), "an argument was evaluated by the shell"


def test_existing_master_port_wins(in_tmp):
    script = make_job(in_tmp, "slurm-local", {"nodes": 2})
    env = run_env(in_tmp, {**stubs(in_tmp), "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node[1-2]",
                           "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "2", "MASTER_PORT": "61234"})
    subprocess.run(["bash", str(script)], env=env, cwd=in_tmp, check=True, timeout=60)
    assert {r["env"]["MASTER_PORT"] for r in ranks(in_tmp / "dumps")} == {"61234"}


def test_sweep_task_gets_its_own_overrides(in_tmp):
    sweep = in_tmp / "sweep.yaml"
    sweep.write_text("list:\n  - {lr: 0.1}\n  - {lr: 0.01, name: \"it's b\"}\n")
    script = make_job(in_tmp, "slurm-local", {"sweep": str(sweep), "args": ["--epochs", "2"]})
    env = run_env(in_tmp, {**stubs(in_tmp), "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1",
                           "SLURM_NTASKS_PER_NODE": "1", "SLURM_ARRAY_TASK_ID": "1"})
    subprocess.run(["bash", str(script)], env=env, cwd=in_tmp, check=True, timeout=60)
    assert ranks(in_tmp / "dumps")[0]["argv"] == ["--epochs", "2", "--lr=0.01", "--name=it's b"]


def test_batch_shell_forwards_the_requeue_signal_to_the_step(in_tmp):
    # srun stand-in: records the signal it gets, then exits like a job that checkpointed and stopped
    srun = textwrap.dedent(f"""\
        #!/bin/bash
        trap 'echo got-USR1 > {in_tmp}/signalled; exit 0' USR1
        touch {in_tmp}/ready
        for _ in $(seq 600); do sleep 0.1; done
        exit 9
    """)
    script = make_job(in_tmp, "slurm-local", {})
    env = run_env(in_tmp, {**stubs(in_tmp, srun), "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1"})
    proc = subprocess.Popen(["bash", str(script)], env=env, cwd=in_tmp)
    deadline = time.time() + 30
    while not (in_tmp / "ready").exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=30) == 0
    assert (in_tmp / "signalled").read_text().strip() == "got-USR1"


def test_batch_script_exits_with_the_steps_code(in_tmp):
    script = make_job(in_tmp, "slurm-local", {"nodes": 2})
    env = run_env(in_tmp, {**stubs(in_tmp), "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node[1-2]",
                           "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "2", "FAIL_RANK": "2"})
    proc = subprocess.run(["bash", str(script)], env=env, cwd=in_tmp, timeout=60)
    assert proc.returncode == 3


def test_local_script_runs_real_ranks(in_tmp):
    script = make_job(in_tmp, "local", {"nproc_per_node": 2, "args": TRICKY})
    proc = subprocess.run(["bash", str(script)], env=run_env(in_tmp, {}), cwd=in_tmp, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = ranks(in_tmp / "dumps")
    assert [r["argv"] for r in got] == [TRICKY, TRICKY]
    assert [r["env"]["RANK"] for r in got] == ["0", "1"]
    assert {(r["env"]["WORLD_SIZE"], r["env"]["MASTER_ADDR"]) for r in got} == {("2", "127.0.0.1")}
    assert not list(in_tmp.glob("PWNED*"))


def test_local_script_stops_the_other_ranks_when_one_fails(in_tmp):
    script = make_job(in_tmp, "local", {"nproc_per_node": 2})
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(script)], env=run_env(in_tmp, {"FAIL_RANK": "1", "HANG_RANK": "0"}),
                          cwd=in_tmp, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "rank 1 exited with status 3" in proc.stderr
    assert time.monotonic() - t0 < 30  # rank 0 would have slept 600 s


def test_early_signal_reaches_handlers_and_spares_unaware_ranks(in_tmp):
    # rank 0 installs a handler (as hpc's runtime does), rank 1 knows nothing of USR1
    (in_tmp / "ranks.py").write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        rank = os.environ["RANK"]
        if rank == "0":
            signal.signal(signal.SIGUSR1, lambda *a: open("{in_tmp}/handled", "w").write("yes"))
        open("{in_tmp}/ready" + rank, "w").close()
        end = time.time() + 3
        while time.time() < end:
            time.sleep(0.05)
        open("{in_tmp}/survived" + rank, "w").close()
    """))
    eff = p.resolve("local", [p.flag_layer({"script": str(in_tmp / "ranks.py"), "nproc_per_node": 2})])
    backends.for_profile(eff.profile).plan(eff, in_tmp / "job").materialize()
    proc = subprocess.Popen(["bash", str(in_tmp / "job" / "job.sh")], env=run_env(in_tmp, {}), cwd=in_tmp)
    deadline = time.time() + 30
    while not ((in_tmp / "ready0").exists() and (in_tmp / "ready1").exists()):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=30) == 0
    assert (in_tmp / "handled").read_text() == "yes"
    assert (in_tmp / "survived0").exists() and (in_tmp / "survived1").exists()
