import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder with a private XDG config, so no user or project profiles leak in."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for key in list(os.environ):
        if key.startswith("HPC_"):
            monkeypatch.delenv(key)
    return tmp_path


def hpc_cmd(*args):
    return [sys.executable, "-m", "hpc", *args]
