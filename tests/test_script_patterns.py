"""Scripts written for Accelerate that resume themselves (transformers' run_*_no_trainer.py, diffusers' training
scripts), run unchanged but for the import, on 2 CPU ranks: tests/no_trainer_shape.py has their shape.

An interrupted run resumed through the script's own `--resume_from_checkpoint` ends with the same weights and
evaluation loss as a straight run, having trained on every batch exactly once; diffusers' save_state under
`if accelerator.is_main_process:` neither hangs nor loses the run; trackers write where Accelerate's do; and under
`hpc submit --resume-args`, the warning signal stops the script, hpc saves for it in its own naming, and the next
attempt is given that checkpoint.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.jobhelpers import hpc, launch_env, local_script_process, submit

SHAPE = Path(__file__).resolve().parent / "no_trainer_shape.py"
# 50 samples, 3 per rank and batch, 2 ranks: 9 batches per epoch; 2 accumulation steps: the epoch's end closes a
# window early, so the scripts' `resume_step = step * 2 - epoch * len(loader)` is a batch off (Accelerate's too)
COMMON = ["--num_train_epochs", "2", "--samples", "50"]


def run(tmp_path: Path, out: str, *args, code: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", str(SHAPE), "--output_dir",
                           str(tmp_path / out), *COMMON, *args], cwd=tmp_path, env=launch_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The run the interrupted ones must end as, without dropout (a rank that saved no RNG keeps its own stream;
    saving does not change training, so one straight run serves every checkpoint naming)."""
    folder = tmp_path_factory.mktemp("straight")
    run(folder, "out", "--dropout", "0")
    return folder / "out"


def final(folder: Path) -> dict:
    return json.loads((folder / "final.json").read_text())


def seen(folder: Path, rank: int) -> list[list[int]]:
    return [json.loads(line)["idx"] for line in (folder / f"seen-rank{rank}.jsonl").read_text().splitlines()]


def test_a_transformers_script_resumed_from_its_step_checkpoint_ends_as_a_straight_run(tmp_path):
    run(tmp_path, "straight", "--checkpointing_steps", "2", "--with_tracking")
    run(tmp_path, "cut", "--checkpointing_steps", "2", "--with_tracking", "--die_after_step", "7", code=17)
    resumed = run(tmp_path, "cut", "--checkpointing_steps", "2", "--with_tracking",
                  "--resume_from_checkpoint", str(tmp_path / "cut" / "step_6"))
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert final(cut) == final(straight)  # dropout too: every rank's random state came back
    # the script asked to skip 3 batches of epoch 1; the checkpoint stood after 2 (a window closed with epoch 0)
    assert "skip_first_batches(3): the checkpoint stopped after 12 samples of epoch 1" in resumed.stderr
    assert "accumulation windows" in resumed.stderr and "would lose 6 samples" in resumed.stderr
    for rank in (0, 1):
        first, second = seen(cut, rank)[:12], seen(cut, rank)[14:]  # step 7's two batches died with it
        assert first + second == seen(straight, rank)  # no batch lost, none twice
    # TensorBoard where Accelerate writes it (project_dir/<project name>), hpc's own JSONL apart in logs/
    assert list((straight / "shape_run").glob("events.out.tfevents.*"))
    assert (straight / "logs" / "shape_run.jsonl").exists()
    # each rank's own part of a replicated checkpoint lies beside rank 0's manifest
    assert (straight / "step_2" / ".rank1.json").exists() and (straight / "step_2" / "manifest.json").exists()


def test_a_diffusers_script_saves_on_the_main_process_alone_and_resumes_from_latest(tmp_path, straight):
    flags = ["--diffusers", "--checkpointing_steps", "3", "--dropout", "0"]
    run(tmp_path, "cut", *flags, "--die_after_step", "7", code=17)  # checkpoint-3 and checkpoint-6 saved
    resumed = run(tmp_path, "cut", *flags, "--resume_from_checkpoint", "latest")
    assert "Resumed from checkpoint: " + str(tmp_path / "cut" / "checkpoint-6") in resumed.stdout
    assert final(tmp_path / "cut") == final(straight)
    # rank 1 never saved: it keeps its own random state, and says so once
    assert resumed.stderr.count("rank 1 keeps its own random state") == 1
    assert not list((tmp_path / "cut").glob("checkpoint-*/.rank1.json"))


def _wait_for_lines(path: Path, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and len(path.read_text().splitlines()) >= n):
        assert time.monotonic() < deadline, f"{path} never reached {n} lines"
        time.sleep(0.05)


def test_the_warning_signal_stops_a_self_resuming_script_and_its_next_attempt_resumes(tmp_path, straight):
    """Local profile: USR1 mid-epoch (no save of the script's due then); hpc stops the script at its next batch,
    saves in the script's naming (read off its own step_2 save), the job runs again with
    `--resume_from_checkpoint <that folder>`, and ends as a straight run."""
    info = submit(tmp_path, "-p", "local", "--nproc", "2",
                  "--resume-args", "--resume_from_checkpoint {checkpoint}", str(SHAPE), "--",
                  "--output_dir", str(tmp_path / "out"), *COMMON, "--checkpointing_steps", "2", "--dropout", "0",
                  "--step_sleep", "0.3")
    job_dir = Path(info["job_dir"])
    _wait_for_lines(tmp_path / "out" / "seen-rank0.jsonl", 7)  # into step 4: step_2 saved, step_4 not yet
    local_script_process(job_dir).send_signal(signal.SIGUSR1)
    assert hpc(tmp_path, "wait", info["job_id"], timeout=240).returncode == 0
    logs = hpc(tmp_path, "logs", "--all", info["job_id"], check=True).stdout
    saved = [line for line in logs.splitlines() if "stop requested (USR1): saved" in line]
    assert saved and "/out/step_" in saved[0], logs[-3000:]
    stopped_at = saved[0].split("/out/")[1].split(";")[0]
    assert f"resuming the script from {tmp_path / 'out' / stopped_at}" in logs, logs[-3000:]
    assert final(tmp_path / "out") == final(straight)
    noted = [json.loads(line) for line in (job_dir / "tasks" / "0.saves").read_text().splitlines()]
    assert any(entry["path"].endswith(stopped_at) for entry in noted)


@pytest.mark.slurm
def test_a_self_resuming_script_preempted_on_slurm_ends_as_a_straight_run(slurm, tmp_path, straight):
    """Two nodes of the on-machine SLURM: `scancel --signal=USR1` mid-epoch, before the script saved anything;
    the ranks stop at the next batch, hpc saves for the script where resume_save_as says, the batch script
    requeues the job, and SLURM's next attempt runs the script with `--resume_from_checkpoint <that folder>`."""
    info = submit(tmp_path, "-p", "slurm-local", "-N", "2", "--ntasks-per-node", "1",
                  "--set", f"resume_save_as={tmp_path / 'out' / 'step_{step}'}",
                  "--resume-args", "--resume_from_checkpoint {checkpoint}", str(SHAPE), "--",
                  "--output_dir", str(tmp_path / "out"), *COMMON, "--checkpointing_steps", "8", "--dropout", "0",
                  "--step_sleep", "0.3")
    _wait_for_lines(tmp_path / "out" / "seen-rank0.jsonl", 7, timeout=180)  # into step 4; step_8 is its first
    subprocess.run(["scancel", "--signal=USR1", info["job_id"]], check=True, capture_output=True)
    assert hpc(tmp_path, "wait", info["job_id"], timeout=300).returncode == 0
    logs = hpc(tmp_path, "logs", "--all", info["job_id"], check=True).stdout
    saved = [line for line in logs.splitlines() if "stop requested (USR1): saved" in line]
    assert saved and f"{tmp_path / 'out'}/step_" in saved[0], logs[-3000:]
    assert "resuming the script from" in logs and "requeued SLURM job" in logs, logs[-3000:]
    assert final(tmp_path / "out") == final(straight)


def test_a_sharded_save_on_the_main_process_alone_is_a_clear_error_not_a_hang(tmp_path):
    """FSDP's state is sharded: save_state under `if accelerator.is_main_process:` cannot work there. The rank
    that came waits for the others as long as the job's hang timeout, then names the mistake."""
    (tmp_path / "alone.py").write_text(
        "import os, sys, torch\n"
        "from hpc import Accelerator, FullyShardedDataParallelPlugin\n"
        "acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(), project_dir=sys.argv[1])\n"
        "model = torch.nn.Linear(4, 4)\n"
        "model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))\n"
        "if acc.is_main_process:\n"
        "    acc.save_state(os.path.join(sys.argv[1], 'checkpoint-1'))\n"
        "acc.end_training()\n")
    proc = hpc(tmp_path, "submit", "-p", "local", "--nproc", "2", "--hang-timeout", "3", "--wait", "alone.py", "--",
               str(tmp_path / "p"), timeout=180)
    assert proc.returncode != 0
    logs = hpc(tmp_path, "logs", "--all", timeout=60).stdout
    assert "save_state was called on 1 of 2 ranks (waited 3 s for the others)" in logs, logs[-3000:]
    assert "not under `if accelerator.is_main_process:`" in logs
