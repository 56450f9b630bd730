"""One rank of an N-D parallelism test: a small transformers Llama built plainly, trained with Accelerate's API.

    python nd_worker.py SPEC_JSON

SPEC keys: mesh ({"tp_size": 2, "dp_shard_size": 2, ...} for a ParallelismConfig; absent: DDP), global_batch (the
same in every mesh: each data-parallel rank takes global_batch / dp), steps, out, project, save (save_state into
this folder at the end; under cp_size the step opens Accelerate's maybe_context_parallel, position_ids left to
hpc), load (load_state from this folder first, then train no step), clip (clip the gradients'
norm to this), pre_tp (the model is made tensor-parallel before prepare(), as transformers' from_pretrained
does). Rank 0 writes to `out`: the losses (mean over the ranks), the whole weights (gathered), and every rank's
count of parameter elements it holds.
"""

import json
import sys

import torch
import transformers

from hpc import Accelerator, ParallelismConfig, set_seed


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=64, length=16):
        self.ids = torch.randint(0, 128, (n, length), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    spec = json.loads(sys.argv[1])
    mesh = spec.get("mesh")
    acc = Accelerator(project_dir=spec["project"], parallelism_config=ParallelismConfig(**mesh) if mesh else None)
    set_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config)
    if spec.get("pre_tp"):  # as transformers' from_pretrained(tp_plan="auto", device_mesh=...) hands it over
        from torch.distributed.tensor.parallel import parallelize_module

        from hpc.runtime.parallel.tensor_parallel import model_plan, resolve

        tp = acc.torch_device_mesh["tp"]
        parallelize_module(model, tp, resolve(model, model_plan(model), tp.size()))
    config = acc.parallelism_config  # given, or made from Accelerate's PARALLELISM_CONFIG_* variables
    cp = config.cp_size if config else 1
    dp = acc.num_processes // ((config.tp_size if config else 1) * cp)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=spec["global_batch"] // dp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    if spec.get("load"):
        acc.load_state(spec["load"])
    losses = []
    for step, batch in enumerate(loader):
        if step == spec["steps"]:
            break
        if cp > 1:  # Accelerate's context-parallel step: labels shifted before the split, the split open to backward
            batch["shift_labels"] = torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=-100)
            # the whole sequence's token count over cp: the cp ranks' mean is then the token mean, as DDP's
            items = (batch["shift_labels"] != -100).sum() / cp
            buffers = [batch["input_ids"], batch["labels"], batch["shift_labels"]]
            with acc.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1, 1],
                                            no_restore_buffers=set(buffers)):
                loss = model(**batch, num_items_in_batch=items).loss
                acc.backward(loss)
        else:
            loss = model(**batch).loss
            acc.backward(loss)
        if spec.get("clip"):
            acc.clip_grad_norm_(model.parameters(), spec["clip"])
        optimizer.step()
        optimizer.zero_grad()
        losses.append(acc.reduce(loss.detach(), "mean").item())
    if spec.get("save"):
        acc.save_state(spec["save"])
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    counts = acc.gather(torch.tensor([held])).tolist()
    weights = acc.get_state_dict(model)
    if acc.is_main_process:
        torch.save({"losses": losses, "weights": weights, "held": counts,
                    "total": sum(v.numel() for v in weights.values())}, spec["out"])
    acc.end_training()


if __name__ == "__main__":
    main()
