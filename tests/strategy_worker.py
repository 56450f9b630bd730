"""One rank of a strategy test: the same AdamW loop under DDP, FSDP2 or DeepSpeed, chosen by a JSON spec.

    python strategy_worker.py SPECS_JSON OUT_FILE

SPECS is one spec or a list, run one after another in the same processes (imports and process group are
paid once). SPEC keys: strategy ("ddp" | "fsdp" | "deepspeed"), k (accumulation), steps, width, and the plugin's
keyword arguments under "plugin", measure (false: skip counting the bytes held). Writes per-step mean losses,
the final full weights and the bytes of training state this rank holds (parameters + gradients + optimizer
state) before the last step; None without measure (each count is a gc.collect() and a walk over every live
object: about a second per spec on a loaded 2-core machine, while the steps themselves take two or three).
"""

import json
import sys

import torch

from hpc import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin, set_seed
from hpc.runtime.tracking.memory_snapshot import held_since, snapshot

FEATURES = 16


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self, width, depth=4):
        super().__init__()
        self.inp = torch.nn.Linear(FEATURES, width)
        self.blocks = torch.nn.Sequential(*[Block(width) for _ in range(depth)])
        self.out = torch.nn.Linear(width, 1)

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))


def data(n=512):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, FEATURES, generator=g)
    return torch.utils.data.TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True)))


def run(spec):
    kind, k, steps, width = spec["strategy"], spec.get("k", 1), spec.get("steps", 20), spec.get("width", 64)
    plugin = spec.get("plugin", {})
    extra = {}
    if kind == "fsdp":
        extra["fsdp_plugin"] = FullyShardedDataParallelPlugin(**plugin)
    elif kind == "deepspeed":
        extra["deepspeed_plugin"] = DeepSpeedPlugin(**plugin)
    acc = Accelerator(gradient_accumulation_steps=k, mixed_precision=spec.get("mixed_precision"), **extra)
    dataset = data()
    measure = spec.get("measure", True)
    baseline = snapshot() if measure else None
    set_seed(1)
    net = Net(width)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True)
    net, opt, loader = acc.prepare(net, opt, loader)
    losses, held, done = [], None, 0
    while done < steps:
        for x, y in loader:
            with acc.accumulate(net):
                loss = torch.nn.functional.mse_loss(net(x).float(), y)
                acc.backward(loss)
                if measure and acc.sync_gradients and done == steps - 1:
                    held = held_since(baseline)
                if spec.get("clip"):
                    acc.clip_grad_norm_(net.parameters(), spec["clip"])
                opt.step()
                opt.zero_grad()
            window = acc.reduce(loss.detach(), "mean")
            if acc.sync_gradients:
                losses.append(window.item())
                done += 1
                if done == steps:
                    break
    state = acc.get_state_dict(net)
    weights = {name: t.float().flatten().tolist() for name, t in sorted(state.items())}
    return acc, {"spec": spec, "losses": losses, "held_bytes": held, "weights": weights,
                 "params": sum(p.numel() for p in Net(width).parameters()), "distributed_type": acc.distributed_type}


def main():
    specs, out = json.loads(sys.argv[1]), sys.argv[2]
    results = [run(spec) for spec in (specs if isinstance(specs, list) else [specs])]
    acc = results[-1][0]
    if acc.is_main_process:
        with open(out, "w") as f:
            json.dump([r for _, r in results], f)
    acc.end_training()


if __name__ == "__main__":
    main()
