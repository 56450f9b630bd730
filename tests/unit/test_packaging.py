"""A non-editable install ships job_templates/ and cluster_configs/ and works from any folder."""

import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    build = tmp_path_factory.mktemp("build")
    # --no-build-isolation: setuptools is already here, and CI must not need the network for this
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--target", str(target), repo], capture_output=True, text=True, timeout=300,
                          cwd=build, env={**os.environ, "PIP_NO_CACHE_DIR": "1", "TMPDIR": str(build)})
    assert proc.returncode == 0, proc.stderr
    return target


def test_installed_package_carries_its_data(installed, tmp_path):
    assert (installed / "hpc" / "job_templates" / "srun.sbatch.j2").is_file()
    assert (installed / "hpc" / "cluster_configs" / "local.yaml").is_file()
    env = {**os.environ, "PYTHONPATH": str(installed), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    code = "import hpc.cluster.folders as r; print(r.builtin_dir('job_templates'))"
    where = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert where.stdout.strip() == str(installed / "hpc" / "job_templates")
    proc = subprocess.run([sys.executable, "-m", "hpc", "render", "-p", "slurm-local", "-N", "2", "train.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2" in proc.stdout
