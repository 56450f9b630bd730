"""One rank of a runtime test; started by `hpc launch --nproc N` (or plain python for one process).

    python runtime_worker.py MODE OUT_FILE [K]
"""

import json
import sys

import torch

from hpc import Accelerator, DistributedDataParallelKwargs, set_seed

N_SAMPLES, FEATURES = 160, 8


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_SAMPLES, FEATURES, generator=g)
    y = x @ torch.randn(FEATURES, 1, generator=g) + 0.1 * torch.randn(N_SAMPLES, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def model():
    set_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def train(batch_size: int, k: int, steps: int, handlers=None):
    acc = Accelerator(gradient_accumulation_steps=k, kwargs_handlers=handlers)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(data(), batch_size=batch_size)
    net, opt, loader = acc.prepare(net, opt, loader)
    done = 0
    while done < steps:
        for x, y in loader:
            with acc.accumulate(net):
                loss = torch.nn.functional.mse_loss(net(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            if acc.sync_gradients:
                done += 1
                if done == steps:
                    break
    return acc, [p.detach().flatten().tolist() for p in acc.unwrap_model(net).parameters()]


def main():
    mode, out = sys.argv[1], sys.argv[2]
    k = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    result = {}
    if mode == "parity":  # per-rank batch 4, 20 optimizer steps
        acc, params = train(batch_size=4 * int(sys.argv[4]) if len(sys.argv) > 4 else 4, k=k, steps=20)
        result = {"params": params}
    elif mode == "comm":
        calls = []

        def counting_hook(state, bucket):
            calls.append(1)
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            return allreduce_hook(None, bucket)

        acc, _ = train(batch_size=4, k=k, steps=5, handlers=[DistributedDataParallelKwargs(comm_hook=counting_hook)])
        result = {"allreduces": len(calls), "windows": 5}
    elif mode == "settings":  # what the job's runtime config says reaches Accelerator
        acc = Accelerator()
        result = {"mixed_precision": acc.mixed_precision, "k": acc.gradient_accumulation_steps,
                  "world": acc.num_processes, "type": acc.distributed_type}
    elif mode == "resume":  # epoch-seeded shuffling and skip_first_batches
        acc = Accelerator(seed=7)
        loader = acc.prepare(torch.utils.data.DataLoader(torch.arange(40), batch_size=4, shuffle=True))
        first = [b.tolist() for b in loader]               # epoch 0
        second = [b.tolist() for b in loader]              # epoch 1: another order
        loader.set_epoch(1)
        rest = [b.tolist() for b in acc.skip_first_batches(loader, 2)]
        result = {"first": first, "second": second, "rest": rest}
    elif mode == "gather":
        acc = Accelerator()
        loader = acc.prepare(torch.utils.data.DataLoader(torch.arange(10), batch_size=2))
        seen = []
        for batch in loader:
            seen += acc.gather_for_metrics(batch).tolist()
        result = {"seen": seen, "plain_gather_len": len(acc.gather(torch.zeros(3)))}
    if acc.is_main_process:
        with open(out, "w") as f:
            json.dump(result, f)
    acc.end_training()


if __name__ == "__main__":
    main()
