"""A small transformer language model, trained on text generated here (no downloads), with hpc's Accelerator.

    hpc launch --nproc 2 scripts/examples/tiny_lm.py --steps 50
    hpc submit --profile local --nproc 2 scripts/examples/tiny_lm.py -- --steps 50
    hpc submit -p slurm-local -N 2 --mixed-precision bf16 scripts/examples/tiny_lm.py -- --steps 50

The corpus is arithmetic sentences ("12 plus 7 is 19."), so the loss visibly falls within a few dozen steps.
"""

import argparse
import math
import random

import torch
from torch import nn

from hpc import Accelerator, set_seed


def corpus(n_sentences: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"{a} plus {b} is {a + b}." for a, b in
                    ((rng.randint(0, 49), rng.randint(0, 49)) for _ in range(n_sentences)))


class CharDataset(torch.utils.data.Dataset):
    def __init__(self, text: str, block: int):
        self.vocab = sorted(set(text))
        ids = torch.tensor([self.vocab.index(c) for c in text])
        self.blocks = ids[: len(ids) // (block + 1) * (block + 1)].view(-1, block + 1)

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return self.blocks[i, :-1], self.blocks[i, 1:]


class TinyLM(nn.Module):
    def __init__(self, vocab: int, block: int, dim: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, block, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block), persistent=False)

    def forward(self, x):
        h = self.embed(x) + self.pos[:, : x.shape[1]]
        return self.head(self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()

    accelerator = Accelerator(log_with="jsonl")
    set_seed(0)
    data = CharDataset(corpus(4000, seed=0), args.block)
    model = TinyLM(len(data.vocab), args.block)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    accelerator.init_trackers("tiny_lm", config=vars(args))

    step = 0
    bar = accelerator.progress(total=args.steps, desc="train")
    while step < args.steps:
        for x, y in loader:
            with accelerator.accumulate(model):
                logits = model(x)
                loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                mean_loss = accelerator.reduce(loss.detach(), "mean").item()
                accelerator.log({"loss": mean_loss, "lr": scheduler.get_last_lr()[0]}, step=step)
                bar.update(1)
                bar.set_postfix(loss=f"{mean_loss:.3f}")
                if step >= args.steps:
                    break
    bar.close()
    accelerator.print(f"final loss {mean_loss:.3f} (uniform would be {math.log(len(data.vocab)):.3f})")
    accelerator.end_training()


if __name__ == "__main__":
    main()
