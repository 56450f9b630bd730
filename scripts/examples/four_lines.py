"""The 4-line example users know from Accelerate, with hpc's import. Runs as it is under
`hpc launch --nproc 2`, `hpc submit --profile local --nproc 2`, and on SLURM (`hpc submit -p slurm-local -N 2`)."""

import sys

import torch

from hpc import Accelerator  # +1

accelerator = Accelerator()  # +2

dataset = torch.randn(64, 10)
model = torch.nn.Linear(10, 2)
optimizer = torch.optim.Adam(model.parameters())
dataloader = torch.utils.data.DataLoader(dataset, batch_size=8)

model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)  # +3

for batch in dataloader:
    optimizer.zero_grad()
    loss = model(batch).mean()
    accelerator.backward(loss)  # +4
    optimizer.step()

# one write per line: ranks may share one output stream
sys.stdout.write(f"rank {accelerator.process_index} of {accelerator.num_processes} "
                 f"{accelerator.distributed_type.value}\n")
