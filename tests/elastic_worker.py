"""One rank of an elastic or min_nodes test: a paced run that checkpoints often, so that a node can die under it
mid-epoch and the job goes on at a smaller world (torchrun's next round, or the job's next attempt).

    python elastic_worker.py SPEC_JSON

SPEC keys: project (checkpoint folder parent), out (result file), epochs, save_every (optimizer steps, 2 if not
given), samples (64 if not given), sleep (seconds a step in the job's first attempt and torchrun round only: room
to kill a node while it trains; the rounds after it run at full speed), sleep_until_killed (every round sleeps
until a file `killed` appears in the project folder), hold_at (rank 0 waits after that step until `killed`
appears: a kill at a known step, however slow the machine). 4 samples a rank a step, shuffled: of 64,
an epoch is 8 steps at world 2, 16 at world 1; of 96, 8 at world 3, 12 at 2, 24 at 1 (a checkpoint at an even step
leaves a whole number of steps of the epoch for any of them). The loop has no resume logic beyond `auto_resume`.

Every step rank 0 notes the sample ids all ranks trained, with the loader's epoch, in an object saved with the
checkpoint; it writes `progress` (the step reached), `steps` (a line "<attempt> <step> <time>" each step), and
`world-a<requeues>-r<restart>` (the world size and the hosts of each attempt and torchrun round, with the time its
first step ended). At the end it writes the ids of each epoch to `out`.
"""

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
from shape_worker import N, SampleLog, regression  # noqa: E402 - beside this file, on the script's own path

from hpc import Accelerator, set_seed
from hpc.runtime.resilience import preemption


def _write_whole(path, text: str) -> None:
    """Replaces the file at once: the tests read these files while the job runs."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)

def main() -> None:
    spec = json.loads(sys.argv[1])
    project = Path(spec["project"])
    project.mkdir(parents=True, exist_ok=True)
    acc = Accelerator(project_dir=str(project), auto_resume=True)
    set_seed(3)
    model, opt, data = regression(spec.get("samples", N))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    log = SampleLog()
    acc.register_for_checkpointing(log)
    hosts = acc.gather_for_metrics([socket.gethostname()], use_gather_object=True)
    attempt = f"a{preemption.requeue_count()}-r{acc._process.env.restart_count}"
    sleep = spec.get("sleep", 0) if attempt == "a0-r0" else 0
    first = True
    while loader.epoch < spec["epochs"]:
        for idx, xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            if acc.is_main_process:  # the step is taken: noted before the gather, a collective a lost node fails
                _write_whole(project / "progress", f"{acc.completed_steps}\n")
                with open(project / "steps", "a") as f:  # measured from outside hpc, for the report's figures
                    f.write(f"{attempt} {acc.completed_steps} {time.time()}\n")
            ids = acc.gather(idx)
            if acc.is_main_process:
                log.rows.append([loader.epoch, ids.tolist()])
                if first:
                    _write_whole(project / f"world-{attempt}", json.dumps(
                        {"world": acc.num_processes, "hosts": sorted(set(hosts)), "trained_at": time.time(),
                         "step": acc.completed_steps}))
            first = False
            if acc.completed_steps % spec.get("save_every", 2) == 0:
                acc.save_state()
            if spec.get("hold_at") == acc.completed_steps and acc.is_main_process:  # a test's: the node goes here
                while not (project / "killed").exists():
                    time.sleep(0.05)
            if spec.get("sleep_until_killed"):  # a benchmark's: every round sleeps until it has killed a node
                sleep = 0 if (project / "killed").exists() else spec.get("sleep", 0)
            time.sleep(sleep)
    if acc.is_main_process:
        epochs = [[] for _ in range(spec["epochs"])]
        for epoch, ids in log.rows:
            epochs[epoch] += ids
        torch.save({"epochs": epochs, "steps": acc.completed_steps}, spec["out"])
    acc.end_training()


if __name__ == "__main__":
    main()
