"""The documents show what hpc does today: the job script in docs/job-script.md is a fresh rendering."""

import subprocess
import sys
from pathlib import Path

from tests.conftest import hpc_cmd

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_job_script_in_the_docs_is_what_hpc_renders(in_tmp):
    (in_tmp / "train.py").write_text("")
    proc = subprocess.run(hpc_cmd("render", "-p", "slurm-local", "-N", "2", "train.py", "--", "--lr", "3e-4",
                                  "--name", "my run"), cwd=in_tmp, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    shown = (DOCS / "job-script.md").read_text().split("```bash\n", 1)[1].split("```\n", 1)[0]
    # the interpreter is the one running hpc: the checkout's own venv
    assert proc.stdout.replace(str(in_tmp), "/tmp/rd").replace(sys.executable, "/tmp/rd/.venv/bin/python") == shown
