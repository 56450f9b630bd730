"""The `hpc` command as a user runs it: a fresh interpreter per call."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import hpc_cmd


def run(*args, cwd, env=None, input=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_")}
    full_env.update({"XDG_CONFIG_HOME": str(cwd / "xdg"), **(env or {})})
    return subprocess.run(hpc_cmd(*args), cwd=cwd, env=full_env, capture_output=True, text=True, input=input,
                          timeout=60)


BAD = [
    (["render", "-p", "nope", "t.py"], "no profile named 'nope'"),
    (["render", "-N", "0", "t.py"], "--nodes = 0"),
    (["render", "-N", "-2", "t.py"], "--nodes = -2"),
    (["render", "-p", "slurm-local", "-t", "9:00:00", "t.py"], "exceeds the profile's max_time"),
    (["render", "-p", "slurm-local", "-t", "soon", "t.py"], "not a SLURM duration"),
    (["render", "-p", "slurm-local", "-N", "99", "t.py"], "max_nodes 3"),
    (["render", "-J", "x$(id)", "t.py"], "not a safe job name"),
    (["render", "-J", "x`id`", "t.py"], "not a safe job name"),
    (["render", "-J", "x'y", "t.py"], "not a safe job name"),
    (["render", "-J", "x\ny", "t.py"], "not a safe job name"),
    (["render", "-p", "slurm-local", "--partition", "a\"b", "t.py"], "--partition"),
    (["render", "-p", "slurm-local", "-w", "node[1-", "t.py"], "'[' without ']'"),
    (["render", "--template", "nope", "t.py"], "no job template named 'nope.j2'"),
    (["render", "--set", "nodez=1", "t.py"], "did you mean 'nodes'"),
    (["render", "--config", "missing.yaml", "t.py"], "job file 'missing.yaml' does not exist"),
    (["render", "t.py", "--", "a\nb"], "one line"),
    (["render"], "nothing to run"),
    (["profile", "show", "nope"], "no profile named 'nope'"),
    (["profile", "validate", "cluster_configs/cycle-a.yaml"], "cycle"),
    (["profile", "validate", "cluster_configs/typo.yaml"], "did you mean 'partition'"),
]


@pytest.fixture
def project(tmp_path):
    d = tmp_path / "cluster_configs"
    d.mkdir()
    (d / "cycle-a.yaml").write_text("extends: cycle-b\n")
    (d / "cycle-b.yaml").write_text("extends: cycle-a\n")
    (d / "typo.yaml").write_text("partiton: x\n")
    (d / "big.yaml").write_text("extends: perlmutter\nmax_nodes: 4096\n")
    return tmp_path


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a)[:40] for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(project, args, message):
    proc = run(*args, cwd=project)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpc: error: ") and "Traceback" not in proc.stderr, proc.stderr
    assert message in lines[0]
    assert "fix:" in lines[0]


def test_env_variable_error_names_the_variable(project):
    proc = run("render", "t.py", cwd=project, env={"HPC_NODES": "many"})
    assert proc.returncode == 2 and "environment: HPC_NODES = 'many': must be an integer" in proc.stderr


def test_unknown_flag_is_a_usage_error(project):
    proc = run("render", "t.py", "--lr", "3", cwd=project)
    assert proc.returncode == 2 and "No such option '--lr'" in proc.stderr
    assert "arguments go after '--'" in proc.stderr


def test_render_out_writes_files_and_never_overwrites(project):
    proc = run("render", "-p", "slurm-local", "-N", "2", "-w", "node[1-2]", "--launcher", "deepspeed",
               "-o", "job", "train.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in (project / "job").iterdir())
    assert names == ["hostfile", "job.sbatch", "runtime.json"]
    assert (project / "job" / "hostfile").read_text() == "node1 slots=2\nnode2 slots=2\n"
    assert json.loads((project / "job" / "runtime.json").read_text())["launcher"] == "deepspeed"
    before = (project / "job" / "job.sbatch").read_text()
    again = run("render", "-p", "slurm-local", "-N", "1", "-o", "job", "train.py", cwd=project)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert (project / "job" / "job.sbatch").read_text() == before


def test_render_json_and_explain(project):
    proc = run("render", "-p", "slurm-local", "--json", "train.py", "--", "--lr", "1", cwd=project)
    data = json.loads(proc.stdout)
    assert data["template"] == "srun.sbatch.j2" and "#SBATCH --partition=debug" in data["script"]
    assert data["effective"]["partition"] == {"value": "debug", "source": "profile slurm-local.yaml"}
    explain = run("render", "-p", "slurm-local", "--explain", "-N", "2", "train.py", cwd=project).stdout
    assert any(line.split()[:3] == ["nodes", "2", "flag"] for line in explain.splitlines())


def test_user_template_overrides_builtin_by_name(project):
    (project / "job_templates").mkdir()
    (project / "job_templates" / "srun.sbatch.j2").write_text(
        '{% include "_sbatch_header.j2" %}\necho custom {{ target | qjoin }}\n')
    proc = run("render", "-p", "slurm-local", "train.py", "--", "a b", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith(f"echo custom {sys.executable} train.py 'a b'")


def test_profile_list_show_validate(project):
    (project / "cluster_configs" / "typo.yaml").unlink()
    listing = run("profile", "list", "--json", cwd=project)
    rows = {r["name"]: r for r in json.loads(listing.stdout)}
    assert rows["slurm-local"]["where"] == "built-in" and rows["cycle-a"]["error"]
    shown = json.loads(run("profile", "show", "perlmutter-debug", "--json", cwd=project).stdout)
    assert shown["profile"]["qos"] == "debug" and shown["profile"]["gpus_per_node"] == 4
    assert shown["origin"]["gpus_per_node"].endswith("perlmutter.yaml")
    ok = run("profile", "validate", "local", "slurm-local", cwd=project)
    assert ok.returncode == 0 and ok.stdout.count("ok: ") == 2


def test_profile_new_from_flags_and_from_answers(project):
    proc = run("profile", "new", "mine", "--partition", "gpu", "--gpus-per-node", "4", "--launcher", "torchrun",
               "-y", cwd=project)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(run("profile", "show", "mine", "--json", cwd=project).stdout)["profile"]
    assert (shown["partition"], shown["gpus_per_node"], shown["launcher"]) == ("gpu", 4, "torchrun")
    again = run("profile", "new", "mine", "-y", cwd=project)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_profile_new_asks_questions(project):
    from click.testing import CliRunner

    from hpc.cli import cli

    os.chdir(project)
    answers = "slurm\nbatch\nacct\n2\n1\n8\n02:00:00\n1-00:00:00\ngcc,cuda\nib0\nsrun\nUSR2\n60\n"
    result = CliRunner().invoke(cli, ["profile", "new", "asked", "-o", "asked.yaml"], input=answers)
    assert result.exit_code == 0, result.output
    from hpc.cluster.config import profiles

    prof, _, _ = profiles.load(str(project / "asked.yaml"))
    assert (prof.partition, prof.account, prof.gpus_per_node, prof.modules) == ("batch", "acct", 2, ["gcc", "cuda"])
    assert (prof.preemption.signal, prof.preemption.lead_time, prof.max_time) == ("USR2", 60, "1-00:00:00")


def test_bad_answer_to_profile_new_writes_nothing(project):
    proc = run("profile", "new", "bad", "--default-time", "whenever", "-y", cwd=project)
    assert proc.returncode == 2 and "not a SLURM duration" in proc.stderr
    assert not list((project / "cluster_configs").glob("*bad*"))


def test_env_json(project):
    data = json.loads(run("env", "--json", cwd=project).stdout)
    assert data["profile"]["name"] == "local" and "torch" in data["packages"]
    assert any(n["name"] == "lo" for n in data["nics"])


def test_completion_script(project):
    proc = run("completion", "bash", cwd=project)
    assert proc.returncode == 0 and "_HPC_COMPLETE" in proc.stdout


# The login-node path must never import torch (or its heavy friends).
PROBE = """
import runpy, sys, io, contextlib
sys.argv = ["hpc"] + sys.argv[1:]
with contextlib.redirect_stdout(io.StringIO()):
    try:
        runpy.run_module("hpc", run_name="__main__")
    except SystemExit as e:
        assert not e.code, e.code
heavy = sorted(m for m in ("torch", "deepspeed", "numpy", "submitit") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""


@pytest.mark.parametrize("args", [
    ["--help"],
    ["render", "-p", "slurm-local", "-N", "3", "train.py", "--", "--lr", "1"],
    ["render", "-p", "big", "-N", "1024", "-w", "nid[000001-001024]", "--launcher", "deepspeed", "train.py"],
    ["profile", "list"],
    ["env"],
    ["estimate-memory", "7B", "-p", "perlmutter", "-N", "2", "--json"],
    ["merge-weights", "--help"],
    ["test", "--help"],
], ids=lambda a: " ".join(a[:2]))
def test_login_path_imports_no_torch(project, args):
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=project, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "XDG_CONFIG_HOME": str(project / "xdg")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY=", proc.stdout
