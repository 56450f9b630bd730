"""A training script with the shape of transformers' `run_*_no_trainer.py` and diffusers' training scripts, written
against Accelerate's API with `hpc` in the import: it resumes itself from `--resume_from_checkpoint` (a folder, or
"latest"), with their arithmetic (`starting_epoch = resume_step // len(train_dataloader)`, then
`skip_first_batches`), saves `step_N`/`epoch_N` (transformers) or `checkpoint-N` on the main process only
(diffusers, `--diffusers`), and tracks with TensorBoard under `output_dir/<run name>`.

Every rank appends the sample ids of each batch it trains on to `output_dir/seen-rank<r>.jsonl`, and the main
process writes the final weights' checksum and the evaluation loss to `output_dir/final.json`, so a test can tell
a preempted and resumed run from an uninterrupted one. `--die_after_step N` ends the process abruptly after
optimizer step N (a crash: no save, no cleanup); `--step_sleep S` slows each step (time for a signal to land).
"""

import argparse
import json
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

from hpc import Accelerator
from hpc.utils import set_seed


class Numbers(Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x.sum(dim=1, keepdim=True) > 0).float()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"idx": torch.tensor(i), "x": self.x[i], "y": self.y[i]}


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    p.add_argument("--num_train_epochs", type=int, default=3)
    p.add_argument("--max_train_steps", type=int, default=None)
    p.add_argument("--gradient_accumulation_steps", type=int, default=2)
    p.add_argument("--per_device_train_batch_size", type=int, default=3)
    p.add_argument("--samples", type=int, default=60)
    p.add_argument("--checkpointing_steps", default=None)
    p.add_argument("--resume_from_checkpoint", default=None)
    p.add_argument("--with_tracking", action="store_true")
    p.add_argument("--diffusers", action="store_true", help="save checkpoint-N on the main process only")
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--die_after_step", type=int, default=None)
    p.add_argument("--step_sleep", type=float, default=0.0)
    return p.parse_args()


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                              log_with="tensorboard" if args.with_tracking else None, project_dir=args.output_dir)
    set_seed(0)
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
    accelerator.wait_for_everyone()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(args.dropout),
                                torch.nn.Linear(16, 1))
    train = DataLoader(Numbers(args.samples), batch_size=args.per_device_train_batch_size, shuffle=True)
    evaluation = DataLoader(Numbers(16), batch_size=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    steps_per_epoch = -(-len(train) // args.gradient_accumulation_steps)
    max_train_steps = args.max_train_steps or args.num_train_epochs * steps_per_epoch
    # transformers' get_scheduler(num_training_steps=max_train_steps * num_processes): a prepared scheduler steps
    # once per process for each optimizer step, in Accelerate as here
    total = max_train_steps * accelerator.num_processes
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / total))
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(model, optimizer, train, evaluation,
                                                                         scheduler)
    # as the scripts do: recomputed after prepare, from the prepared loader's length
    steps_per_epoch = -(-len(train) // args.gradient_accumulation_steps)
    num_train_epochs = -(-max_train_steps // steps_per_epoch)
    if args.with_tracking:
        accelerator.init_trackers("shape_run", {"lr": 1e-2})

    completed_steps, starting_epoch, resume_step = 0, 0, None
    if args.resume_from_checkpoint:
        path = args.resume_from_checkpoint
        if path == "latest":  # diffusers: the newest checkpoint-N in output_dir
            dirs = sorted((d for d in os.listdir(args.output_dir) if d.startswith("checkpoint-")),
                          key=lambda d: int(d.split("-")[1]))
            path = os.path.join(args.output_dir, dirs[-1]) if dirs else None
        if path is not None:
            accelerator.print(f"Resumed from checkpoint: {path}")
            accelerator.load_state(path)
            name = os.path.basename(path.rstrip("/"))
            if "epoch" in name:
                starting_epoch = int(name.replace("epoch_", "")) + 1
                resume_step = None
                completed_steps = starting_epoch * steps_per_epoch
            else:  # transformers' arithmetic, to the letter
                number = int(name.replace("step_", "").replace("checkpoint-", ""))
                resume_step = number * args.gradient_accumulation_steps
                starting_epoch = resume_step // len(train)
                completed_steps = resume_step // args.gradient_accumulation_steps
                resume_step -= starting_epoch * len(train)

    seen = open(os.path.join(args.output_dir, f"seen-rank{accelerator.process_index}.jsonl"), "a")
    for epoch in range(starting_epoch, num_train_epochs):
        model.train()
        if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            active = accelerator.skip_first_batches(train, resume_step)
        else:
            active = train
        for batch in active:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch["x"]), batch["y"])
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            seen.write(json.dumps({"epoch": epoch, "idx": batch["idx"].tolist()}) + "\n")
            seen.flush()
            if accelerator.sync_gradients:
                completed_steps += 1
                if args.with_tracking:
                    accelerator.log({"train_loss": loss.item()}, step=completed_steps)
                time.sleep(args.step_sleep)
                if args.checkpointing_steps and args.checkpointing_steps.isdigit() and \
                        completed_steps % int(args.checkpointing_steps) == 0:
                    if args.diffusers:
                        if accelerator.is_main_process:
                            accelerator.save_state(os.path.join(args.output_dir, f"checkpoint-{completed_steps}"))
                    else:
                        accelerator.save_state(os.path.join(args.output_dir, f"step_{completed_steps}"))
                if completed_steps == args.die_after_step:
                    os._exit(17)
            if completed_steps >= max_train_steps:
                break

        model.eval()
        losses = []
        for batch in evaluation:
            with torch.no_grad():
                out = model(batch["x"])
            losses.append(accelerator.gather_for_metrics(
                torch.nn.functional.binary_cross_entropy_with_logits(out, batch["y"]).reshape(1)))
        eval_loss = torch.cat(losses).mean().item()
        if args.with_tracking:
            accelerator.log({"eval_loss": eval_loss, "epoch": epoch}, step=completed_steps)
        if args.checkpointing_steps == "epoch":
            accelerator.save_state(os.path.join(args.output_dir, f"epoch_{epoch}"))

    accelerator.wait_for_everyone()
    weights = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        total = sum(float(v.double().sum()) for v in weights.values())
        with open(os.path.join(args.output_dir, "final.json"), "w") as f:
            json.dump({"weights": total, "eval_loss": eval_loss, "completed_steps": completed_steps,
                       "lr": scheduler.get_last_lr()[0]}, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
