"""The checkpoints of a self-resuming script, as the next attempt's batch script finds them (torch-free), and the
version string version-gated scripts read."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.runtime.checkpoint import manifest
from hpc.runtime.checkpoint import script_resume as script_checkpoints


@pytest.mark.parametrize("folder,step,naming", [
    ("/o/step_12", 12, "/o/step_{step}"), ("/o/checkpoint-500", 500, "/o/checkpoint-{step}"),
    ("/run12/step_12", 12, "/run12/step_{step}"), ("/o/s12-of-12", 12, "/o/s12-of-{step}"),
    ("/o/epoch_1", 10, None), ("/o/latest", 4, None), ("/o/step_112", 12, None)])
def test_the_scripts_naming_is_read_off_a_folder_it_saved(folder, step, naming):
    assert script_checkpoints.naming(folder, step) == naming


def _checkpoint(folder: Path, step: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "model_0.pt").write_bytes(bytes([step]) * 1000)
    manifest.commit(folder, {"model_0.pt": manifest.file_entry(folder / "model_0.pt")},
                    {"step": step, "format": "full"}, fsync=False)
    return folder


def test_the_newest_noted_checkpoint_that_verifies_is_the_one_resumed_from(tmp_path, capsys):
    job = tmp_path / "job"
    (job / "tasks").mkdir(parents=True)
    for step in (2, 4, 6):
        _checkpoint(tmp_path / "out" / f"step_{step}", step)
        script_checkpoints.note(job, "0", tmp_path / "out" / f"step_{step}", step)
    (tmp_path / "out" / "step_8").mkdir()  # a save cut short: never committed
    script_checkpoints.note(job, "0", tmp_path / "out" / "step_8", 8)
    with open(job / "tasks" / "0.saves", "a") as f:
        f.write('{"path": "/x", "st')  # a line cut short by a crash
    assert script_checkpoints.newest(job, "0") == tmp_path / "out" / "step_6"
    damaged = tmp_path / "out" / "step_6" / "model_0.pt"
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\x00")
    assert script_checkpoints.newest(job, "0") == tmp_path / "out" / "step_4"
    said = capsys.readouterr().err
    assert "not resuming from step_8: " in said and "not resuming from step_6: " in said and "checksum" in said
    assert script_checkpoints.newest(job, "1") is None  # another array task noted nothing


def test_the_batch_scripts_command_prints_the_folder_without_importing_torch(tmp_path):
    job = tmp_path / "job"
    (job / "tasks").mkdir(parents=True)
    code = ("import sys, runpy; sys.argv = ['x', sys.argv[1], '0']\n"
            "try:\n    runpy.run_module('hpc.runtime.checkpoint.script_resume', run_name='__main__')\n"
            "except SystemExit as e:\n    print('torch' in sys.modules, e.code)\n")
    none = subprocess.run([sys.executable, "-c", code, str(job)], capture_output=True, text=True, timeout=60)
    assert none.stdout.split() == ["False", "1"] and "starts from the beginning" in none.stderr
    script_checkpoints.note(job, "0", _checkpoint(tmp_path / "out" / "step_3", 3), 3)
    found = subprocess.run([sys.executable, "-c", code, str(job)], capture_output=True, text=True, timeout=60)
    assert found.stdout.split() == [str(tmp_path / "out" / "step_3"), "False", "0"]


def test_version_gated_scripts_see_the_accelerate_api_level():
    import tomllib
    from packaging.version import Version

    import hpc

    assert Version(hpc.__version__) >= Version("0.16.0")  # diffusers registers its save/load hooks
    assert Version(hpc.__version__).release == tuple(int(p) for p in hpc.ACCELERATE_API_VERSION.split("."))
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert hpc.HPC_VERSION == project["version"] and hpc.__version__.endswith(f"+hpc.{project['version']}")
    out = subprocess.run([sys.executable, "-m", "hpc", "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == f"hpc {project['version']} (Accelerate API {hpc.ACCELERATE_API_VERSION})"
    assert json.loads(subprocess.run([sys.executable, "-m", "hpc", "env", "--json"], capture_output=True,
                                     text=True, timeout=60).stdout)["accelerate_api"] == hpc.ACCELERATE_API_VERSION
