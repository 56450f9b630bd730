"""One rank of the Megatron-LM layout test: the training loop of transformers' run_clm_no_trainer.py with the four
edits of Accelerate's Megatron-LM page (MegatronLMDummyScheduler, megatron_lm_plugin.global_batch_size, losses
averaged over the data-parallel group, save_state/load_state), imports from hpc, on a small Llama (or GPT-2) built
from a config.

    python megatron_worker.py SPEC_JSON

SPEC keys: model ("gpt2": a small GPT-2, its head tied; else a Llama), global_batch (the same in every layout), steps,
out, project, clip (plain data parallelism clips by hand what the plugin's gradient_clipping clips), save
(save_state after `save_at` steps; after the run, load_state from it and train the steps after it again:
"resumed"), load (after the run, load_state another layout's checkpoint: "loaded_weights"; with load_resume, train the
steps after save_at from it: "load_resumed"). The layout comes from
the launch (MEGATRON_LM_* variables), plain data parallelism without. Rank 0 writes to `out`: per-step training
losses, the evaluation loss, the whole weights, and each rank's count of parameter and optimizer-state elements it
holds.
"""

import json
import sys

import torch
import transformers

from hpc import Accelerator, DistributedType, set_seed
from hpc.utils.megatron_lm import MegatronLMDummyScheduler, avg_losses_across_data_parallel_group


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=64, length=16, seed=1):
        self.ids = torch.randint(0, 128, (n, length), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}


def main() -> None:
    spec = json.loads(sys.argv[1])
    acc = Accelerator(project_dir=spec["project"])
    megatron = acc.distributed_type == DistributedType.MEGATRON_LM
    set_seed(0)
    if spec.get("model") == "gpt2":  # the seed's model: learned positions, fused attention, its head tied
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_embd=32, n_layer=4, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False))
    if megatron:
        plugin = acc.state.megatron_lm_plugin
        dp = acc.num_processes // (plugin.tp_degree * plugin.pp_degree)
    else:
        dp = acc.num_processes
    batch = spec["global_batch"] // dp
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=batch)
    eval_loader = torch.utils.data.DataLoader(Tokens(16, seed=2), batch_size=batch)
    # run_clm's two groups: its no-decay names match nothing of a Llama, so the second is empty (and a stage's groups
    # hold only its own parameters); DCP's flattened optimizer state once failed to load such a group
    no_decay = ["bias", "layer_norm.weight"]
    optimizer = torch.optim.AdamW([
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ], lr=1e-2)
    steps = spec["steps"]
    if megatron:
        scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=steps, warmup_num_steps=1)
    else:
        scheduler = transformers.get_scheduler("linear", optimizer, num_warmup_steps=1 * acc.num_processes,
                                               num_training_steps=steps * acc.num_processes)
    model, optimizer, loader, eval_loader, scheduler = acc.prepare(model, optimizer, loader, eval_loader, scheduler)
    total_batch = acc.state.megatron_lm_plugin.global_batch_size if megatron else batch * acc.num_processes
    assert total_batch == spec["global_batch"], total_batch

    def mean(loss):  # the seed's edit: Megatron's losses are averaged over the data-parallel group
        return (avg_losses_across_data_parallel_group([loss]) if megatron else acc.reduce(loss.detach(), "mean")).item()

    def train(start: int) -> list:
        losses = []
        model.train()
        for step, batch in enumerate(loader):
            if step < start:
                continue
            if step == steps:
                break
            loss = model(**batch).loss
            acc.backward(loss)
            if not megatron and spec.get("clip"):
                acc.clip_grad_norm_(model.parameters(), spec["clip"])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(mean(loss))
            if spec.get("save") and step + 1 == spec["save_at"]:
                acc.save_state(spec["save"])
                out["saved_weights"] = acc.get_state_dict(model)
        return losses

    def evaluate() -> float:
        model.eval()
        eval_losses = []
        with torch.no_grad():
            for batch in eval_loader:
                eval_losses.append(mean(model(**batch).loss))
        return sum(eval_losses) / len(eval_losses)

    out: dict = {}
    out["losses"] = train(0)
    out["eval"] = evaluate()
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    state = [v for s in optimizer.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    held_state = sum(v.to_local().numel() if hasattr(v, "to_local") else v.numel() for v in state)
    counts = acc.gather(torch.tensor([held, held_state])).tolist()
    weights = acc.get_state_dict(model)
    pipeline = getattr(model, "_pipeline", None)  # which of torch's schedules ran the layout's pipeline
    out["schedule"] = type(pipeline.schedule).__name__ if pipeline is not None else None
    out.update(held=counts, total=sum(v.numel() for v in weights.values()), lr=scheduler.get_last_lr(),
               weights=weights, global_batch=total_batch, distributed_type=acc.distributed_type.value)
    if megatron and spec.get("generate"):  # greedy decoding beside transformers' generate on the same weights
        prompt = Tokens(2, length=spec["generate"], seed=3).ids
        out["generated"] = model.megatron_generate(prompt, max_new_tokens=4).cpu()
        out["prompt"] = prompt
        out["main"] = acc.gather(torch.tensor([acc.is_main_process])).tolist()
    if spec.get("save"):  # resumed from the checkpoint: the steps after it again
        acc.load_state(spec["save"])
        out["resumed"] = train(spec["save_at"])
    if spec.get("load"):  # another layout's checkpoint: its weights here
        acc.load_state(spec["load"])
        out["loaded_weights"] = acc.get_state_dict(model)
        if spec.get("load_resume"):  # the optimizer's moments too came across the layouts
            out["load_resumed"] = train(spec["save_at"])
    if acc.process_index == 0:
        torch.save(out, spec["out"])
    acc.end_training()


if __name__ == "__main__":
    main()
