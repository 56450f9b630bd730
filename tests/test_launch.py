"""`hpc launch`: local processes, inside srun tasks (also in a user's own sbatch script), torchrun per node."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.jobhelpers import dumps, make_project

REPO = Path(__file__).resolve().parent.parent


def launch(project, *args, env=None, timeout=120):
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "HPC_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "NODE_RANK", "GROUP_RANK",
                                 "TORCHELASTIC"))}
    full.update({"DUMP_DIR": str(project / "dumps"), **(env or {})})
    return subprocess.run([sys.executable, "-m", "hpc", "launch", *args], cwd=project, env=full,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path)


def test_nproc_starts_local_ranks(project):
    proc = launch(project, "--nproc", "2", "dump.py", "--lr", "it's")
    assert proc.returncode == 0, proc.stderr
    ranks = dumps(project)
    assert [r["env"]["RANK"] for r in ranks] == ["0", "1"] and {r["env"]["WORLD_SIZE"] for r in ranks} == {"2"}
    assert all(r["argv"] == ["--lr", "it's"] for r in ranks)


def test_the_throw_away_job_folder_goes_with_the_job(project):
    """`hpc launch` renders its job into a private mkdtemp folder: hundreds of them used to pile up in /tmp."""
    (project / "where.py").write_text("import json, os, sys\n"
                                      "keys = ('HPC_JOB_DIR', 'HPC_THROWAWAY_JOB_DIR')\n"
                                      "if os.environ['RANK'] == '0':\n"
                                      "    json.dump({k: os.environ.get(k) for k in keys}, open(sys.argv[1], 'w'))\n")
    proc = launch(project, "--nproc", "2", "where.py", str(project / "where.json"))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads((project / "where.json").read_text())
    assert Path(seen["HPC_JOB_DIR"]).name.startswith("hpc-launch-") and not os.path.exists(seen["HPC_JOB_DIR"])
    assert seen["HPC_THROWAWAY_JOB_DIR"] is None  # a job the ranks start themselves keeps its folder


def test_a_single_process_runs_leftover_variables_do_not_swallow_nproc(project):
    """RANK=0 WORLD_SIZE=1 left in a shell (a notebook, an earlier single-process run) used to make `--nproc 2`
    start one process, silently. A launcher's real ranks that disagree with the ask are a one-line error."""
    leftover = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29999"}
    proc = launch(project, "--nproc", "2", "dump.py", env=leftover)
    assert proc.returncode == 0, proc.stderr
    ranks = dumps(project)
    assert [r["env"]["RANK"] for r in ranks] == ["0", "1"] and {r["env"]["WORLD_SIZE"] for r in ranks} == {"2"}
    proc = launch(project, "--num_processes", "2", "dump.py", env={"RANK": "3", "WORLD_SIZE": "4"})
    assert proc.returncode == 2 and "already rank 3 of 4" in proc.stderr.strip().splitlines()[-1], proc.stderr


# what a submitting shell may hold (sbatch exports it all to every task): SLURM's numbers must win
LEFT_BY_THE_SHELL = {"NODE_RANK": "0", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "1"}


@pytest.mark.parametrize("left", [{}, LEFT_BY_THE_SHELL], ids=["clean", "left-by-the-shell"])
def test_in_an_srun_task_it_sets_the_variables_and_execs(project, left):
    slurm = {"SLURM_JOB_ID": "4321", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "cn[3-4]",
             "SLURM_TASKS_PER_NODE": "2(x2)"}
    proc = launch(project, "dump.py", env=slurm | left)
    assert proc.returncode == 0, proc.stderr
    (rank,) = dumps(project)
    assert rank["env"] | {"SLURM_ARRAY_TASK_ID": None} == {
        "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1",
        "MASTER_ADDR": "cn3", "MASTER_PORT": str(4321 % 4536 + 61000), "SLURM_ARRAY_TASK_ID": None,
        "SLURM_JOB_ID": "4321"}


def test_multi_node_on_localhost_is_refused(project):
    proc = launch(project, "dump.py", env={"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                                           "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"})
    assert proc.returncode == 2 and "would rendezvous on localhost" in proc.stderr
    assert not dumps(project)


def _sbatch_and_wait(project, script_text, timeout=240):
    script = project / "own.sbatch"
    script.write_text(script_text)
    env = {**os.environ, "DUMP_DIR": str(project / "dumps")}
    job = subprocess.run(["sbatch", "--parsable", f"--chdir={project}", f"--output={project}/out-%j.log", str(script)],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, "job did not finish"
        time.sleep(0.5)
    return (project / f"out-{job}.log").read_text()


@pytest.mark.slurm
def test_users_own_sbatch_script_with_srun_hpc_launch(slurm, project):
    out = _sbatch_and_wait(project, f"#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=2\n"
                                    f"srun {sys.executable} -m hpc launch dump.py\n")
    ranks = dumps(project)
    assert sorted(int(r["env"]["RANK"]) for r in ranks) == [0, 1, 2, 3], out
    # any two of the cluster's nodes (one an earlier test killed may still be on its way back); the first is master
    hosts = {r["host"] for r in ranks}
    assert len(hosts) == 2 and {r["env"]["MASTER_ADDR"] for r in ranks} == {min(hosts)}, ranks


@pytest.mark.slurm
def test_torchrun_per_node_from_srun(slurm, project):
    example = REPO / "scripts" / "examples" / "hello_ranks.py"
    out = _sbatch_and_wait(project, f"#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=1 --cpus-per-task=2\n"
                                    f"srun {sys.executable} -m hpc launch --launcher torchrun --nproc 2 {example}\n")
    assert out.count("world_size=4") == 4 and out.count("all_reduce=6 ok") == 4, out
