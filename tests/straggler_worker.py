"""A short DDP training whose every step has a fixed amount of the rank's own compute (a chain of matrix
products before the backward): on a throttled node that part takes longer, and the straggler check names it.

    python straggler_worker.py [STEPS [GO_FILE]]

With GO_FILE, each rank writes GO_FILE.ready<RANK> once it is set up and waits for GO_FILE before its first step
(a test throttles a node then: start-up on it would take long).
"""

import sys
import time
from pathlib import Path

import torch

from hpc import Accelerator

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Linear(512, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = accelerator.prepare(model, optimizer)
if len(sys.argv) > 2:
    go = Path(sys.argv[2])
    Path(f"{go}.ready{accelerator.process_index}").touch()
    while not go.exists():
        time.sleep(0.1)
# ~50 ms of one core's time a step: more than a throttled node's CPU quota allows it per period
features, weight = torch.randn(256, 512), torch.randn(512, 512) / 23
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 16):
    hidden = features
    for _ in range(25):
        hidden = torch.tanh(hidden @ weight)
    accelerator.backward(model(hidden).sum())
    optimizer.step()
    optimizer.zero_grad()
accelerator.end_training()
accelerator.print("finished")
