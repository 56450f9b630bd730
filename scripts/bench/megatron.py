#!/usr/bin/env python3
"""Step time and peak memory per rank of one small transformers Llama (or GPT-2: fused q/k/v, tied head) on 4
ranks under Megatron-LM's layouts (on torch's parallelism), beside DDP and FSDP on the same global batch.

    python scripts/bench/megatron.py [--steps 30] [--hidden 256] [--layers 4] [--model llama|gpt2]

Each layout is one `hpc launch --nproc 4` of this file (CPU and gloo where there is no GPU), launched as
Accelerate launches it (`--use_megatron_lm --megatron_lm_*`, `--use_fsdp`): the median time of the steps after 5
warm-up ones, the largest peak resident memory of a rank (CPU) or peak allocated GPU memory, the parameter elements
the largest rank holds, and the last loss (equal across layouts up to rounding: the same samples each step). On 2
cores, 4 ranks share them: the figures rank communication patterns, they are not a throughput claim.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MEGATRON = ["--use_megatron_lm", "--megatron_lm_gradient_clipping", "0"]
LAYOUTS = {
    "ddp": [],
    "fsdp": ["--use_fsdp"],
    "tp2 x pp2 (sp)": [*MEGATRON, "--megatron_lm_tp_degree", "2", "--megatron_lm_pp_degree", "2",
                       "--megatron_lm_num_micro_batches", "4", "--megatron_lm_sequence_parallelism", "true"],
    "tp2 x dp2 (dist. opt.)": [*MEGATRON, "--megatron_lm_tp_degree", "2", "--megatron_lm_sequence_parallelism",
                               "true", "--megatron_lm_use_distributed_optimizer", "true"],
    "pp2 x dp2 (dist. opt.)": [*MEGATRON, "--megatron_lm_pp_degree", "2", "--megatron_lm_num_micro_batches", "2",
                               "--megatron_lm_use_distributed_optimizer", "true"],
    "pp2 x dp2 (interleaved)": [*MEGATRON, "--megatron_lm_pp_degree", "2", "--megatron_lm_num_micro_batches", "2",
                                "--megatron_lm_use_distributed_optimizer", "true",
                                "--megatron_lm_num_layers_per_virtual_pipeline_stage", "1"],
    "pp4 (1F1B, 4 micro)": [*MEGATRON, "--megatron_lm_pp_degree", "4", "--megatron_lm_num_micro_batches", "4"],
}


def rank_main(spec: dict) -> None:
    import resource
    import statistics

    import torch
    import transformers

    from hpc import Accelerator, DistributedType, set_seed

    acc = Accelerator()
    set_seed(0)
    if spec.get("model") == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_embd=spec["hidden"], n_layer=spec["layers"], n_head=8, vocab_size=1024, n_positions=128,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=spec["hidden"], intermediate_size=4 * spec["hidden"], num_hidden_layers=spec["layers"],
            num_attention_heads=8, num_key_value_heads=4, vocab_size=1024, tie_word_embeddings=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dp = acc.num_processes
    if acc.distributed_type == DistributedType.MEGATRON_LM:
        plugin = acc.state.megatron_lm_plugin
        dp //= plugin.tp_degree * plugin.pp_degree
    ids = torch.randint(0, 1024, (spec["steps"] * 8, 128), generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(ids, batch_size=8 // dp)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    times, loss = [], None
    for batch in loader:
        start = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        acc.wait_for_everyone()
        times.append(time.perf_counter() - start)
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    peak = (torch.cuda.max_memory_allocated() if torch.cuda.is_available()
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    facts = acc.gather(torch.tensor([[held, peak]])).tolist()
    loss = loss.detach().float()
    if acc.distributed_type == DistributedType.MEGATRON_LM:  # already the mean over the micro-batches and stages
        from hpc.utils.megatron_lm import avg_losses_across_data_parallel_group

        loss = avg_losses_across_data_parallel_group([loss])[0]
    else:
        loss = acc.reduce(loss, "mean")
    if acc.process_index == 0:
        print("RESULT " + json.dumps({"median_s": statistics.median(times[5:]), "held": max(f[0] for f in facts),
                                      "peak": max(f[1] for f in facts), "loss": loss.item()}))
    acc.end_training()


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):
        rank_main(json.loads(sys.argv[1]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--model", choices=("llama", "gpt2"), default="llama")
    args = p.parse_args()
    rows = []
    for name, flags in LAYOUTS.items():
        spec = {"steps": args.steps, "hidden": args.hidden, "layers": args.layers, "model": args.model}
        done = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "4", *flags, __file__,
                               json.dumps(spec)], capture_output=True, text=True,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{name}: {done.stderr[-2000:]}")
        rows.append((name, json.loads(line[7:])))
        print(f"  {name} done", file=sys.stderr)
    print(f"{'layout':<24} {'step_ms':>8} {'peak MiB/rank':>14} {'params/rank':>12} {'last loss':>10}")
    for name, r in rows:
        print(f"{name:<24} {r['median_s'] * 1000:8.1f} {r['peak'] / 2**20:14.1f} {r['held']:12,} {r['loss']:10.5f}")


if __name__ == "__main__":
    main()
