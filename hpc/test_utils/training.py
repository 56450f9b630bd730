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
