"""`hpc.submit()` from Python: bad keys raise before anything is submitted (the jobs: tests/test_api.py)."""

import pytest

import hpc
from tests.jobhelpers import make_project


@pytest.fixture
def project(tmp_path, monkeypatch):
    make_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def test_bad_keys_raise_the_projects_error(project):
    with pytest.raises(hpc.HpcError, match="nodez"):
        hpc.submit("dump.py", profile="local", nodez=2)
