"""One rank of the min_nodes test: a paced run that checkpoints every 2 steps, so that a node can die under it,
and the job's next attempt goes on at a smaller world.

    python min_nodes_worker.py SPEC_JSON

SPEC keys: project (checkpoint folder parent), out (result file), epochs, sleep (seconds a step in the first
attempt only). 96 samples, 4 a rank a step: an epoch is 8 steps at world 3, 12 at world 2, 24 at world 1, and a
checkpoint at an even step leaves a whole number of steps of the epoch for any of them. The loop has no resume
logic beyond `auto_resume`.

Rank 0 notes the sample ids all ranks trained each step (in an object saved with the checkpoint), `progress`
(the step reached) and `world-a<requeues>` (the world size and the hosts of each attempt); at the end it writes
each epoch's ids to `out`.
"""

import json
import socket
import sys
import time
from pathlib import Path

import torch
from shape_worker import SampleLog  # noqa: E402 - beside this file, on the script's own path

from hpc import Accelerator, set_seed
from hpc.runtime.resilience import preemption

SAMPLES = 96


def main() -> None:
    spec = json.loads(sys.argv[1])
    project = Path(spec["project"])
    project.mkdir(parents=True, exist_ok=True)
    acc = Accelerator(project_dir=str(project), auto_resume=True)
    set_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(SAMPLES, 8, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(torch.arange(SAMPLES), x, x.sum(dim=1, keepdim=True).sin())
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    log = SampleLog()
    acc.register_for_checkpointing(log)
    hosts = acc.gather_for_metrics([socket.gethostname()], use_gather_object=True)
    attempt = preemption.requeue_count()
    sleep = spec.get("sleep", 0) if attempt == 0 else 0
    first = True
    while loader.epoch < spec["epochs"]:
        for idx, xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            ids = acc.gather(idx)
            if acc.is_main_process:
                log.rows.append([loader.epoch, ids.tolist()])
                (project / "progress").write_text(f"{acc.completed_steps}\n")
                if first:
                    (project / f"world-a{attempt}").write_text(json.dumps(
                        {"world": acc.num_processes, "hosts": sorted(set(hosts)), "step": acc.completed_steps}))
            first = False
            if acc.completed_steps % 2 == 0:
                acc.save_state()
            time.sleep(sleep)
    if acc.is_main_process:
        epochs = [[] for _ in range(spec["epochs"])]
        for epoch, ids in log.rows:
            epochs[epoch] += ids
        torch.save({"epochs": epochs, "steps": acc.completed_steps}, spec["out"])
    acc.end_training()


if __name__ == "__main__":
    main()
