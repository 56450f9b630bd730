"""The suite's scheduling rests on xdist's loadgroup and tests/conftest.py's groups: every SLURM test on one
worker, one after another, and each module's other tests together. Two ways it silently stopped holding: pytest
9.2 with xdist 3.8 ignores the groups (hence pyproject's `pytest<9`), and a grouping hook that runs after xdist's
own is too late. This runs a small suite through the real hook under the installed pair and checks the workers."""

import os
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.conftest import REPO

# the SLURM tests alternate with the others in collection order, so a scheduler that ignores the groups splits
# each group over both workers
TESTS = """import os, pytest
@pytest.mark.parametrize("i", [pytest.param(i, marks=[pytest.mark.slurm] * (i % 2)) for i in range(12)])
def test_record(i):
    group = "slurm" if i % 2 else __name__
    with open(os.environ["RECORD"], "a") as f:
        f.write(f"{group} {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""
CONFTEST = "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"


def test_slurm_tests_keep_to_one_worker_and_each_modules_others_to_one(tmp_path):
    for module in ("test_one.py", "test_two.py"):
        (tmp_path / module).write_text(TESTS)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    record = tmp_path / "record"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env |= {"RECORD": str(record), "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                          "loadgroup", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    workers = defaultdict(set)
    for line in record.read_text().splitlines():
        group, worker = line.split()
        workers[group].add(worker)
    assert sorted(workers) == ["slurm", "test_one", "test_two"], dict(workers)
    assert all(len(w) == 1 for w in workers.values()), f"pytest {pytest.__version__}: {dict(workers)}"
