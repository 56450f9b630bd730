"""`hpc profile new --detect` and `hpc profile check` on a live SLURM: a cluster of scripts/slurm-local of its own,
beside the default one, with fake GPUs (GRES gpu:2 per node), the default cluster's partitions (which differ in
preemption) and a login node over SSH. Parsing is tested against recorded output in tests/unit/test_profile_detect.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import SLURM_LOCAL, _why_no_slurm
from tests.test_remote_ssh import masked

pytestmark = pytest.mark.slurm  # with the suite's other SLURM tests, one after another on one worker
# its own folder and ports: the default cluster (/tmp/hpc-slurm, 6817, 17001-, ssh 2222) and the QOS one
# (/tmp/hpc-slurm-qos, 6827-6829, 17101-) keep running beside it
DIR = "/tmp/hpc-slurm-gres"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "profiles.md"
GRES_CLUSTER = {"SLURM_LOCAL_DIR": DIR, "SLURM_LOCAL_CTLD_PORT": "6837", "SLURM_LOCAL_NODE_PORT0": "17200",
                "SLURM_LOCAL_NODES": "2", "SLURM_LOCAL_CPUS": "2", "SLURM_LOCAL_GPUS": "2", "SLURM_LOCAL_SSH": "1",
                "SLURM_LOCAL_SSH_PORT": "2232", "FRESH": "1"}
LOGIN = f"""\
name: login
extends: slurm-local
remote:
  host: 127.0.0.1
  port: 2232
  user: root
  identity_file: {DIR}/ssh/id_ed25519
  known_hosts: {DIR}/ssh/known_hosts
  job_root: {DIR}/remote-jobs
"""
HELLO = ("import os, socket\n"
         "print('hello', os.environ['RANK'], os.environ['WORLD_SIZE'], socket.gethostname(),"
         " os.environ.get('SLURM_GPUS_ON_NODE'), flush=True)\n")


def _slurm_local(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # SLURM_CONF: the script sets its own
    return subprocess.run([str(SLURM_LOCAL), *args], env={**env, **GRES_CLUSTER}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def gres_slurm():
    """The GRES cluster, started afresh for this module and down after it, with a site's limits on its default
    partition (MaxTime, DefaultTime); SLURM_CONF points at it meanwhile."""
    reason = _why_no_slurm()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SLURM tests, but {reason}")
        pytest.skip(reason)
    proc = _slurm_local("up", timeout=600)
    if proc.returncode != 0:
        _slurm_local("down", timeout=120)
        pytest.fail(f"SLURM_LOCAL_GPUS=2 scripts/slurm-local up failed:\n{proc.stdout}\n{proc.stderr}")
    conf = f"{DIR}/etc/slurm.conf"
    old = os.environ.get("SLURM_CONF")  # the default cluster's, when its session fixture is up
    os.environ["SLURM_CONF"] = conf
    try:
        scontrol("update", "PartitionName=debug", "MaxTime=01:00:00", "DefaultTime=00:10:00")
        yield conf
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        _slurm_local("down", timeout=120)


def scontrol(*args):
    subprocess.run(["scontrol", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def project(gres_slurm, tmp_path):
    code = tmp_path / "project"
    (code / "cluster_configs").mkdir(parents=True)
    (code / "cluster_configs" / "login.yaml").write_text(LOGIN)
    (code / "hello.py").write_text(HELLO)
    return code


def hpc(project, *args, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_")}
    env.update({"XDG_DATA_HOME": str(project.parent / "xdg-data"), "XDG_CONFIG_HOME": str(project.parent / "xdg")})
    return subprocess.run([sys.executable, "-m", "hpc", *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=timeout)


def detected(project, name):
    return yaml.safe_load((project / "cluster_configs" / f"{name}.yaml").read_text())


# what the cluster is: 2 nodes of 2 CPUs and 2 GPUs, all on 127.0.0.1
CLUSTER = {"max_nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "network_interface": "lo", "max_array_size": 1001}


def test_detect_writes_the_cluster_as_it_is_and_a_two_node_job_runs_with_it(project):
    made = hpc(project, "profile", "new", "det", "--detect", "-y")
    assert made.returncode == 0, made.stderr
    assert detected(project, "det") == {"name": "det", "scheduler": "slurm", "partition": "debug", **CLUSTER,
                                        "default_time": "00:10:00", "max_time": "01:00:00"}
    text = (project / "cluster_configs" / "det.yaml").read_text()
    shown = DOCS.read_text().split("$ cat cluster_configs/det.yaml\n", 1)[1].split("```\n", 1)[0]
    assert text == shown  # docs/profiles.md shows what it writes
    assert "# GPUs (GRES gpu) on each node of debug\ngpus_per_node: 2" in text
    assert "PreemptMode=OFF GraceTime=0: jobs here are not preempted" in text
    assert hpc(project, "profile", "validate", "--live", "det").returncode == 0
    grace = hpc(project, "profile", "new", "grace", "--detect", "-y", "--partition", "lowgrace")
    assert grace.returncode == 0, grace.stderr
    assert detected(project, "grace")["preemption"] == {"lead_time": 30}  # lowgrace: GraceTime=30
    assert "max_time" not in detected(project, "grace")  # MaxTime=UNLIMITED: nothing to write
    low = (project / "cluster_configs" / "low.yaml")
    assert hpc(project, "profile", "new", "low", "--detect", "-y", "--partition", "low", "-o", str(low)).returncode == 0
    assert "GraceTime=0: a preempted job is killed at once" in low.read_text()

    # the fake GPUs are /dev/null: vetting rightly finds none visible, so it is off for this job
    job = hpc(project, "submit", "--json", "-p", "det", "-N", "2", "--set", "vet=false", "hello.py")
    assert job.returncode == 0, job.stderr
    info = json.loads(job.stdout)
    waited = hpc(project, "wait", info["job_id"])
    assert waited.returncode == 0 and "COMPLETED" in waited.stdout, waited.stdout + waited.stderr
    logs = os.path.join(info["job_dir"], "logs")
    lines = sorted(line for name in os.listdir(logs) if name.startswith("rank")
                   for line in open(os.path.join(logs, name)) if line.startswith("hello"))
    assert lines == [f"hello {r} 4 node{r // 2 + 1} 2\n" for r in range(4)]  # a rank per GPU, 2 per node


def test_detect_over_the_login_node_finds_the_same(project, tmp_path):
    stub = tmp_path / "no-slurm-here"  # SLURM's commands masked here: only the login node can answer
    stub.write_text("#!/bin/sh\necho \"$0: SLURM is masked\" >&2\nexit 97\n")
    stub.chmod(0o755)
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg-data"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    made = masked(stub, project, sys.executable, "-m", "hpc", "profile", "new", "far", "--detect", "-y",
                  "--remote", "login", env=env)
    assert made.returncode == 0, made.stderr
    far = detected(project, "far")
    assert {k: far[k] for k in CLUSTER} == CLUSTER and far["partition"] == "debug"
    assert far["remote"]["port"] == 2232 and "over SSH to root@127.0.0.1:2232" in \
        (project / "cluster_configs" / "far.yaml").read_text().replace("\n# ", " ")
    checked = masked(stub, project, sys.executable, "-m", "hpc", "profile", "check", "far", env=env)
    assert checked.returncode == 0 and "ok: far fits the cluster over SSH" in checked.stdout, checked.stderr


def test_a_changed_cluster_is_named_by_check(project):
    for name, partition in (("det", "debug"), ("grace", "lowgrace")):
        made = hpc(project, "profile", "new", name, "--detect", "-y", "--partition", partition)
        assert made.returncode == 0, made.stderr
    scontrol("update", "PartitionName=debug", "MaxTime=00:30:00")
    scontrol("update", "PartitionName=lowgrace", "GraceTime=10")
    try:
        checked = hpc(project, "profile", "check", "det")
        assert checked.returncode == 2 and checked.stderr.count("\n") == 1, checked.stderr
        assert checked.stdout.splitlines() == ["det: max_time 01:00:00 exceeds partition debug's MaxTime 00:30:00"]
        assert "does not fit the cluster: 1 difference" in checked.stderr
        grace = hpc(project, "profile", "check", "grace")
        assert grace.returncode == 2 and "lead_time 30 s is longer than partition lowgrace's GraceTime 10 s" \
            in grace.stdout
        scontrol("delete", "PartitionName=lowgrace")
        gone = hpc(project, "profile", "check", "grace")
        assert gone.returncode == 2 and gone.stdout.startswith("grace: partition lowgrace no longer exists")
    finally:  # as the module found it
        scontrol("update", "PartitionName=debug", "MaxTime=01:00:00")
        subprocess.run(["scontrol", "create", "PartitionName=lowgrace", "Nodes=ALL", "MaxTime=INFINITE",
                        "PriorityTier=1", "PreemptMode=REQUEUE", "GraceTime=30"], capture_output=True, timeout=30)
