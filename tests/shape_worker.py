"""One rank of a shape-change test: a run that checkpoints at one world size and goes on at another.

    python shape_worker.py SPEC_JSON

SPEC keys: strategy ("ddp" | "fsdp" | "deepspeed"), batch ("rank": 4 samples a rank, "global": 16 in all, each
rank 16 / world), epochs, project, out, save_at (optimizer steps done when the checkpoint is taken), save_point
("step": right after that optimizer step; "fetch": at the top of the loop, the next batch fetched and not yet
trained, as `if step % N == 0: save_state()` there), named (the checkpoint's folder; the run trains on through it).

A run given a project whose checkpoints/ holds a step folder resumes there (auto_resume), mid-epoch; one given
`load` resumes as a self-resuming script does instead: load_state(load), then skip_first_batches(loader, skip), its
own count, in the checkpoint's epoch `load_epoch`. Every step, rank
0 notes the sample ids all ranks trained, with the loader's epoch, in an object saved with the checkpoint; at the
end it writes them and the final weights to `out`.
"""

import json
import sys

import torch

from hpc import Accelerator, FullyShardedDataParallelPlugin, set_seed

N = 64


class SampleLog:
    def __init__(self):
        self.rows = []

    def state_dict(self):
        return {"rows": [list(r) for r in self.rows]}

    def load_state_dict(self, state):
        self.rows = [list(r) for r in state["rows"]]


def regression(samples: int = N):
    """The workers' model, optimizer and data: sample ids beside their inputs and targets, so that a log of the
    ids trained says which samples each step took."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(samples, 8, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(torch.arange(samples), x, x.sum(dim=1, keepdim=True).sin())
    return model, opt, data


def main() -> None:
    spec = json.loads(sys.argv[1])
    extra = {}
    if spec["strategy"] == "fsdp":
        extra["fsdp_plugin"] = FullyShardedDataParallelPlugin()
    elif spec["strategy"] == "deepspeed":
        extra["deepspeed_plugin"] = {"zero_stage": 2}
    acc = Accelerator(project_dir=spec["project"], auto_resume="load" not in spec, **extra)
    set_seed(3)
    model, opt, data = regression()
    batch = 4 if spec["batch"] == "rank" else 16 // acc.num_processes
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    log = SampleLog()
    acc.register_for_checkpointing(log)
    named = spec.get("named")
    active = loader
    if "load" in spec:
        acc.load_state(spec["load"])
        active = acc.skip_first_batches(loader, spec["skip"])
    while loader.epoch < spec["epochs"]:
        for idx, xb, yb in active:
            if named and spec["save_point"] == "fetch" and acc.completed_steps == spec["save_at"]:
                acc.save_state(named)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            ids = acc.gather(idx)
            if acc.is_main_process:
                log.rows.append([loader.epoch, ids.tolist()])
            if named and spec["save_point"] == "step" and acc.completed_steps == spec["save_at"]:
                acc.save_state(named)
        active = loader
    weights = acc.get_state_dict(model)
    if acc.is_main_process:
        epochs = [[] for _ in range(spec["epochs"])]
        for epoch, ids in log.rows:
            epochs[epoch] += ids
        torch.save({"epochs": epochs, "weights": weights, "steps": acc.completed_steps}, spec["out"])
    acc.end_training()


if __name__ == "__main__":
    main()
