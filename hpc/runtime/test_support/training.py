"""A one-feature linear regression (y = a*x + b + noise) and its model: small enough that every rank can compute
the expected weights by hand, which is what distributed tests compare against."""

from __future__ import annotations

import numpy as np
import torch


class RegressionDataset:
    """``length`` samples of ``{"x": x, "y": a*x + b + N(0, 0.1)}``, reproducible from ``seed``."""

    def __init__(self, a: float = 2, b: float = 3, length: int = 64, seed: int | None = None):
        generator = np.random.default_rng(seed)
        self.length = length
        self.x = generator.normal(size=(length,)).astype(np.float32)
        self.y = a * self.x + b + generator.normal(scale=0.1, size=(length,)).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        return {"x": self.x[index], "y": self.y[index]}


class RegressionModel(torch.nn.Module):
    """``x * a + b`` with scalar parameters; prints its dtypes on the first batch (tests read that line to see
    that mixed precision reached the model)."""

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.first_batch = True

    def forward(self, x=None):
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        return x * self.a + self.b


# --- small MRPC loaders, for Accelerate's example scripts run with TESTING_MOCKED_DATALOADERS=1 ---------------
# They read the few sentence pairs under tests/test_samples/MRPC/ (relative to the working directory, as
# Accelerate's do) with the datasets library, and tokenize with the tokenizer the examples name.
MRPC_SAMPLES = {"train": "tests/test_samples/MRPC/train.csv", "validation": "tests/test_samples/MRPC/dev.csv"}


def _mrpc_samples():
    from datasets import load_dataset

    return load_dataset("csv", data_files=MRPC_SAMPLES)


def mocked_dataloaders(accelerator, batch_size: int = 16):
    """Train (batch 2, shuffled) and validation (batch 1) loaders of sentence pairs for bert-base-cased."""
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("bert-base-cased")
    samples = _mrpc_samples()
    label_ids = {name: i for i, name in enumerate(samples["train"].unique("label"))}

    def tokenize(batch):
        out = tokenizer(batch["sentence1"], batch["sentence2"], truncation=True, max_length=None,
                        padding="max_length")
        out["labels"] = [label_ids[name] for name in batch["label"]]
        return out

    tokenized = samples.map(tokenize, batched=True, remove_columns=["sentence1", "sentence2", "label"])

    def collate(examples):
        return tokenizer.pad(examples, padding="longest", return_tensors="pt")

    return (DataLoader(tokenized["train"], shuffle=True, collate_fn=collate, batch_size=2),
            DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate, batch_size=1))


def mocked_dataloaders_for_autoregressive_models(accelerator, batch_size: int = 16):
    """Next-token loaders of the first sentences, for HuggingFaceTB/SmolLM-360M (padding with its eos token)."""
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM-360M")
    tokenizer.pad_token = tokenizer.eos_token
    samples = _mrpc_samples()
    with accelerator.main_process_first():
        tokenized = samples.map(lambda batch: tokenizer(batch["sentence1"], truncation=True, max_length=None,
                                                        return_attention_mask=False),
                                batched=True, remove_columns=["sentence1", "sentence2", "label"])

    def collate(examples):
        longest = max(len(example["input_ids"]) for example in examples)
        multiple = 16 if accelerator.mixed_precision == "fp8" else 8 if accelerator.mixed_precision != "no" else None
        batch = tokenizer.pad(examples, padding="max_length", max_length=longest + 1, pad_to_multiple_of=multiple,
                              return_tensors="pt")
        # inputs are the tokens but the last, labels the tokens but the first; padding is not predicted
        labels = batch["input_ids"][:, 1:]
        batch["input_ids"] = batch["input_ids"][:, :-1]
        if "attention_mask" in batch:
            batch["attention_mask"] = batch["attention_mask"][:, :-1]
        batch["labels"] = torch.where(labels == tokenizer.pad_token_id, -100, labels)
        return batch

    return (DataLoader(tokenized["train"], shuffle=False, collate_fn=collate, batch_size=2),
            DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate, batch_size=1))
