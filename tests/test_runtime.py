"""Accelerator on CPU + gloo with real processes: parity with one process, accumulation, metrics, the examples
(fp16, bf16 and tracking in this process: tests/unit/test_runtime.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobhelpers import launch_env

HERE = Path(__file__).resolve().parent
WORKER = HERE / "runtime_worker.py"


def run_worker(tmp_path, nproc, *args):
    out = tmp_path / f"out-{nproc}-{'-'.join(args)}.json"
    env = launch_env()
    argv = ([sys.executable, "-m", "hpc", "launch", "--nproc", str(nproc)] if nproc > 1 else [sys.executable])
    proc = subprocess.run([*argv, str(WORKER), args[0], str(out), *args[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def max_diff(a, b):
    return max(abs(x - y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def test_two_rank_ddp_equals_one_process_on_the_concatenated_batches(tmp_path):
    two = run_worker(tmp_path, 2, "parity", "1")            # 2 ranks x batch 4
    one = run_worker(tmp_path, 1, "parity", "1", "2")       # 1 process x batch 8: the same samples per step
    assert max_diff(two["params"], one["params"]) < 1e-6


def test_accumulation_k4_on_two_ranks_equals_one_batch_four_times_as_large(tmp_path):
    acc = run_worker(tmp_path, 2, "parity", "4")            # 2 ranks x batch 4 x 4 micro-steps
    big = run_worker(tmp_path, 1, "parity", "1", "8")       # 1 process x batch 32
    assert max_diff(acc["params"], big["params"]) < 1e-6


def test_exactly_one_allreduce_per_accumulation_window(tmp_path):
    got = run_worker(tmp_path, 2, "comm", "4")
    assert got["allreduces"] == got["windows"] == 5


def test_gather_for_metrics_returns_exactly_the_dataset(tmp_path):
    got = run_worker(tmp_path, 2, "gather")                 # 10 samples, batch 2, 2 ranks: last round padded
    assert got["seen"] == list(range(10))
    assert got["plain_gather_len"] == 6


FOUR = HERE.parent / "scripts" / "examples" / "four_lines.py"


def test_the_four_line_example_runs_unchanged_under_hpc_launch(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))}
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", str(FOUR)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["rank 0 of 2 MULTI_CPU", "rank 1 of 2 MULTI_CPU"]


def test_the_four_line_example_under_hpc_submit_local(tmp_path):
    from tests.jobhelpers import hpc

    proc = hpc(tmp_path, "submit", "-p", "local", "--nproc", "2", "--no-snapshot", "--wait", str(FOUR), timeout=300)
    assert proc.returncode == 0, proc.stderr
    logs = hpc(tmp_path, "logs", "--all", check=True).stdout
    assert "[rank0] rank 0 of 2 MULTI_CPU" in logs and "[rank1] rank 1 of 2 MULTI_CPU" in logs


@pytest.mark.slurm
def test_the_four_line_example_on_two_slurm_nodes(slurm, tmp_path):
    from tests.jobhelpers import hpc

    proc = hpc(tmp_path, "submit", "-p", "slurm-local", "-N", "2", "--no-snapshot", "--wait", str(FOUR), timeout=300)
    assert proc.returncode == 0, proc.stderr
    logs = hpc(tmp_path, "logs", "--all", check=True).stdout
    assert all(f"rank {r} of 4 MULTI_CPU" in logs for r in range(4)), logs


def test_runtime_config_settings_reach_the_accelerator(tmp_path):
    """`hpc submit --mixed-precision bf16 --gradient-accumulation-steps 4` -> runtime.json -> Accelerator()."""
    from tests.jobhelpers import hpc

    out = tmp_path / "settings.json"
    proc = hpc(tmp_path, "submit", "-p", "local", "--nproc", "2", "--mixed-precision", "bf16",
               "--gradient-accumulation-steps", "4", "--no-snapshot", "--wait", str(WORKER), "--", "settings",
               str(out), env={"PYTHONPATH": str(HERE.parent)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == {"mixed_precision": "bf16", "k": 4, "world": 2, "type": "MULTI_CPU"}


def test_shuffle_is_seeded_by_epoch_and_skip_first_batches_resumes_mid_epoch(tmp_path):
    a = run_worker(tmp_path, 2, "resume")
    b = run_worker(tmp_path, 2, "resume")
    assert a == b                                    # a restarted job sees the same order
    assert a["first"] != a["second"]                 # each epoch reshuffles
    assert a["rest"] == a["second"][2:]              # resuming epoch 1 after 2 batches


def test_the_tiny_lm_example_learns(tmp_path):
    example = HERE.parent / "scripts" / "examples" / "tiny_lm.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))}
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", str(example), "--steps", "15"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    final, uniform = (float(x)
                      for x in proc.stdout.split("final loss ")[1].replace(")", "").split(" (uniform would be "))
    assert final < 0.75 * uniform
    # the attempt's goodput (hpc/goodput, hpc/redone_steps) is logged once at its end, beside the script's lines
    lines = (tmp_path / "logs" / "tiny_lm.jsonl").read_text().splitlines()
    logged = [json.loads(x) for x in lines if '"hpc/' not in x]
    assert [e["step"] for e in logged[1:]] == list(range(1, 16))  # main process only: one line per step
    assert sum('"hpc/goodput"' in x for x in lines) == 1
