import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder with a private XDG config and HF_HOME, so no user or project profiles, default
    job file or Accelerate config leak in."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no Accelerate default config from this machine
    for key in list(os.environ):
        if key.startswith(("HPC_", "ACCELERATE_", "FSDP_")):
            monkeypatch.delenv(key)
    return tmp_path


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test starts with the worker's environment as the one before it found it: a test that starts an
    Accelerator in this process exports RANK, NODE_RANK, ... into os.environ (one left NODE_RANK=0 for a later
    test's srun launch, under xdist's groups)."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _slurm_nodes_revived(request):
    """After a SLURM test, every node of slurm-local runs again: a test that killed a node and failed before it
    revived it would leave a node SLURM still schedules on for a while, and the next test's job would hang there.
    A node SLURM drained during the test (its own "Kill task failed", when a step outlasted UnkillableStepTimeout)
    is taken back too: left drained, every later job that names it waits forever."""
    import subprocess

    yield
    if request.node.get_closest_marker("slurm") is None:
        return
    run = Path(os.environ.get("SLURM_LOCAL_DIR", "/tmp/hpc-slurm")) / "run"
    for pid_file in sorted(run.glob("slurmd-*.pid")):
        node = pid_file.name[len("slurmd-"):-len(".pid")]
        try:
            os.kill(int(pid_file.read_text()), 0)
        except (OSError, ValueError):
            subprocess.run([str(SLURM_LOCAL), "revive-node", node], capture_output=True, timeout=180)
    if os.environ.get("SLURM_CONF"):
        listed = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30)
        drained = {line.split()[0] for line in listed.stdout.splitlines()
                   if len(line.split()) == 2 and line.split()[1].startswith(("drain", "drng"))}
        for node in sorted(drained):
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True,
                           timeout=30)


def hpc_cmd(*args):
    return [sys.executable, "-m", "hpc", *args]


SLURM_LOCAL = REPO / "scripts" / "slurm-local"


def _why_no_slurm() -> str | None:
    if os.geteuid() != 0:
        return "the on-machine SLURM cluster needs root (scripts/slurm-local up)"
    import shutil

    if not shutil.which("unshare"):
        return "unshare (util-linux) is missing"
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        return "SLURM is not installed and apt-get is missing to install it"
    return None


@pytest.fixture(scope="session")
def slurm():
    """The real multi-node SLURM of scripts/slurm-local, up for the session; yields its SLURM_CONF.

    Skips with the reason where it cannot run; under CI it must run, so there it fails instead.
    """
    import subprocess

    reason = _why_no_slurm()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SLURM tests, but {reason}")
        pytest.skip(reason)
    was_up = subprocess.run([str(SLURM_LOCAL), "status"], capture_output=True).returncode == 0
    proc = subprocess.run([str(SLURM_LOCAL), "up"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"scripts/slurm-local up failed:\n{proc.stdout}\n{proc.stderr}")
    conf = subprocess.run([str(SLURM_LOCAL), "env"], capture_output=True, text=True).stdout.split("=", 1)[1].strip()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf  # every SLURM client needs it; without it they ask DNS for a controller
    yield conf
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
    if not was_up:
        subprocess.run([str(SLURM_LOCAL), "down"], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless Chromium, installed with apt-get where it is missing (as root, as the SLURM tests install
    SLURM); where it cannot be, the test skips with the reason, and under CI fails instead."""
    import shutil
    import subprocess

    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            subprocess.run(cmd, capture_output=True, env=env, timeout=900)
        found = shutil.which("chromium")
    if found is None:
        why = "no chromium, and it cannot be installed here (apt-get as root)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test, but {why}")
        pytest.skip(why)
    return found


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups as it runs
def pytest_collection_modifyitems(config, items):
    """Under xdist (pyproject's `-n 3 --dist loadgroup`): every test that uses the SLURM cluster runs on one and
    the same worker, one after another, as the cluster's nodes, partitions and preemption are shared; every other
    test stays with its module's (its module fixtures, often a launch of ranks, are built once). Not whole modules
    to the SLURM worker: test_strategies has 2 SLURM tests and 28 CPU-bound others, which made that worker the
    longer one by minutes.

    Checked by tests/unit/test_xdist_groups.py: pytest 9.2 with xdist 3.8 ignores the groups (pyproject pins
    pytest<9), and without tryfirst this hook ran after xdist had read them."""
    def on_slurm(item) -> bool:
        return item.get_closest_marker("slurm") is not None or "slurm" in getattr(item, "fixturenames", ())

    for item in items:
        item.add_marker(pytest.mark.xdist_group("slurm" if on_slurm(item) else item.module.__name__))
    # the SLURM group, the longest by far, first: xdist hands groups out in collection order
    # (--no-loadscope-reorder), and one started last would be the run's tail
    items.sort(key=lambda item: not on_slurm(item))
