"""Bad input in a training process (the rest are in tests/unit/test_bad_input.py): an HpcError nobody catches is
one line per rank, on 2 real ranks."""

import os
import subprocess
import sys

from tests.jobhelpers import make_project


def test_a_refused_setting_in_a_job_is_one_line_per_rank(tmp_path):
    """An HpcError nobody catches in a training process: `[rank N] hpc: error: ...`, no traceback, exit 2."""
    project = make_project(tmp_path)
    (project / "refused.py").write_text("from hpc.state import PartialState\n\nPartialState(bogus=1)\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "HPC_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "TORCHELASTIC"))}
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", "refused.py"], cwd=project,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    ranks = [line for line in proc.stderr.splitlines() if line.startswith("[rank ")]
    launcher = [line for line in proc.stderr.splitlines() if line.startswith("hpc: rank ")]
    assert len(ranks) + len(launcher) == len(proc.stderr.splitlines()), proc.stderr
    # the first rank to fail stops the other, which may not have got as far: at least one line, one per rank
    assert ranks and len({line[:8] for line in ranks}) == len(ranks), proc.stderr
    assert all("] hpc: error: PartialState(bogus=...) is not supported" in line for line in ranks), proc.stderr
