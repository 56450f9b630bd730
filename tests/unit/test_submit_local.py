"""`hpc submit --profile local` and `hpc status`: input refused before any job starts (the local jobs themselves:
tests/test_submit_local.py)."""

import pytest

from tests.jobhelpers import hpc, make_project


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path)


def test_missing_script_fails_before_anything_is_written(project):
    proc = hpc(project, "submit", "-p", "local", "nope.py")
    assert proc.returncode == 2 and "script 'nope.py' not found" in proc.stderr
    assert not (project / "hpc-jobs").exists() or not any((project / "hpc-jobs").iterdir())


def test_unknown_job_id(project):
    proc = hpc(project, "status", "12345")
    assert proc.returncode == 2 and "no job '12345'" in proc.stderr
