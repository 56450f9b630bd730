"""One rank of a resume test: a small training run that checkpoints, may be interrupted, and resumes.

    python resume_worker.py SPEC_JSON

SPEC keys: project (checkpoint folder parent), out (result file), strategy ("ddp" | "fsdp" | "deepspeed"), steps
(optimizer steps in all), k (accumulation), save_every, async (background saves), sleep (seconds per step: room for
a signal to arrive), sleep_attempts (sleep only in the first N attempts, counted by requeues: the attempts a test
interrupts; the last one then runs its remaining steps at full speed), hide_slurm (the rank cannot run SLURM's
commands, as in a container without them), hold_at (on the first attempt, wait at that step until a stop comes or
the file `go` appears in the project), block_at + block_rank (on the first attempt that rank sleeps for good at
that step), crash_at (raise at that step on the first attempt), crash_rank (only that rank crashes; the others go
on into the next collective), world_kill (SIGKILL instead of raising). The loop has no resume logic of its own
beyond `auto_resume`: a restarted job continues from the newest checkpoint, mid-epoch, with the loss log restored
alongside the weights. Rank 0 writes `progress` (the step reached, for tests that interrupt at the right moment)
and, at the end, the per-step losses and the final weights.
"""

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch

from hpc import Accelerator, FullyShardedDataParallelPlugin, set_seed
from hpc.runtime.resilience import preemption


class LossLog:
    def __init__(self):
        self.rows = []

    def state_dict(self):
        return {"rows": list(self.rows)}

    def load_state_dict(self, state):
        self.rows = list(state["rows"])


def train(spec: dict) -> None:
    """One rank's training (also submitted as a function through submitit)."""
    if spec.get("hide_slurm"):
        os.environ["PATH"] = os.path.dirname(sys.executable)  # no scontrol, squeue, ... from here on
    extra = {"fsdp_plugin": FullyShardedDataParallelPlugin()} if spec.get("strategy") == "fsdp" else {}
    if spec.get("strategy") == "deepspeed":
        extra["deepspeed_plugin"] = {"zero_stage": spec.get("zero_stage", 2)}
    acc = Accelerator(project_dir=spec["project"], gradient_accumulation_steps=spec.get("k", 1), auto_resume=True,
                      checkpoint_async=spec.get("async", False), **extra)
    set_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    log = LossLog()
    acc.register_for_checkpointing(log)
    total, every = spec["steps"], spec.get("save_every", 1)
    progress = Path(spec["project"]) / "progress"
    progress.parent.mkdir(parents=True, exist_ok=True)
    attempt = [preemption.requeue_count(), acc._process.env.restart_count]  # (requeues, elastic restarts)
    first_attempt = attempt == [0, 0]
    sleep = spec.get("sleep", 0) if attempt[0] < spec.get("sleep_attempts", float("inf")) else 0
    Path(spec["project"], f"host-a{attempt[0]}-r{acc.process_index}").write_text(socket.gethostname())
    while acc.completed_steps < total:
        for xb, yb in loader:
            with acc.accumulate():
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
            if not acc.sync_gradients:
                continue
            step = acc.completed_steps
            log.rows.append([step, acc.reduce(loss.detach(), "mean").item(), attempt])
            if acc.is_main_process:  # replaced at once: the tests read it while the job runs
                progress.with_name("progress.part").write_text(f"{step}\n")
                os.replace(progress.with_name("progress.part"), progress)
            if step == spec.get("crash_at") and first_attempt and spec.get("crash_rank", acc.process_index) == \
                    acc.process_index:
                Path(spec["project"], "crashed_at").write_text(f"{time.time()}\n")
                if spec.get("world_kill"):
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError(f"planned crash at step {step}")
            if step == spec.get("block_at") and first_attempt and spec.get("block_rank") == acc.process_index:
                Path(spec["project"], "blocked_at").write_text(f"{time.time()}\n")
                time.sleep(10**6)  # a stuck rank: the others wait for it in their next collective
            if step % every == 0:
                acc.save_state()
            if step == spec.get("hold_at") and first_attempt:
                _hold(acc, Path(spec["project"]) / "go")
            acc.preemption_point()
            time.sleep(sleep)
            if step >= total:
                break
    weights = acc.get_state_dict(model)
    if acc.is_main_process:
        torch.save({"losses": [r[:2] for r in log.rows], "attempts": sorted({tuple(r[2]) for r in log.rows}),
                    "weights": weights}, spec["out"])
    acc.end_training()


def _hold(acc, go: Path) -> None:
    """Wait (every rank alike: each test is a collective) until told to stop, or until `go` exists."""
    while not acc.should_stop and acc.reduce(torch.tensor([float(go.exists())]), "max").item() == 0:
        time.sleep(0.2)


def main():
    train(json.loads(sys.argv[1]))


if __name__ == "__main__":
    main()
