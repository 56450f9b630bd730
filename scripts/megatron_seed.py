#!/usr/bin/env python3
"""Run the script of Accelerate's Megatron-LM page (transformers' run_clm_no_trainer.py with its four Megatron edits,
as pacman100/accelerate-megatron-test ships it) under hpc, imports changed only, with the page's accelerate config
file, in each Megatron layout on 4 CPU processes, then resume GPT-2's tp2 x pp2 run from its step_2 checkpoint.

    git --git-dir=$(fetch pacman100/accelerate-megatron-test) archive HEAD src | tar x -C /tmp/megatron-src
    .venv/bin/python scripts/megatron_seed.py --megatron-src /tmp/megatron-src

The Hub stands in as in scripts/hf_examples.py (a tiny Llama from a config, a word-level tokenizer, made-up text),
and a tiny GPT-2 (the page's model: its q/k/v one fused layer, its head tied, GPT-2's default dropout of 0.1, whose
masks differ between layouts) in the same layouts. The config file is the page's (megatron_lm_gpt_config.yaml: tp 2,
pp 2, 2 micro-batches, sequence parallelism, the distributed optimizer, recomputed activations, clipping 1.0; nulls
for what `accelerate config` was not told), with num_processes 4, no mixed precision and use_cpu (this machine has
no GPU); the other layouts change only the degrees. Every layout trains the same global batch of 8 (the page's
script logs it). The evaluation loss is the script's: tp2 x pp2 (one data rank) evaluates batches of 8, the others
two data ranks' batches of 4, and the script's evaluation loader drops the last partial batch, so the two kinds see
different samples (per-step parity with plain data parallelism on the same batches is tests/test_megatron.py's). The
script's lines that fail with the transformers installed here (`get_full_repo_name`, `send_example_telemetry`,
`DistributedType.TPU`) are changed; nothing else.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hf_examples  # this folder is on sys.path when the script runs

REPO = Path(__file__).resolve().parents[1]
DRIFT = [
    ("from transformers.utils import check_min_version, get_full_repo_name, send_example_telemetry",
     "from transformers.utils import check_min_version\nsend_example_telemetry = lambda *a, **k: None"),
    ("DistributedType.TPU", "DistributedType.XLA"),
]
LAYOUTS = {"tp2 x pp2 (sp)": (2, 2), "tp2 x dp2 (sp)": (2, 1), "pp2 x dp2": (1, 2)}


def build_gpt2(models: Path) -> None:
    """A tiny GPT-2 beside hf_examples' Llama, with its tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    (models / "gpt2").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(models / "llama" / name, models / "gpt2" / name)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(hf_examples.WORDS) + 6, n_positions=128, n_embd=32, n_layer=2,
                               n_head=2, bos_token_id=2, eos_token_id=3)).save_pretrained(models / "gpt2")
ARGS = ["--model_name_or_path", "{models}/llama", "--train_file", "{data}/lm_train.txt", "--validation_file",
        "{data}/lm_validation.txt", "--block_size", "16", "--num_train_epochs", "1", "--n_train", "0", "--n_val", "0",
        "--learning_rate", "1e-3", "--max_train_steps", "6", "--seed", "0", "--checkpointing_steps", "2"]
GLOBAL_BATCH = 8


def config(page: str, tp: int, pp: int) -> str:
    text = page.replace("num_processes: 8", "num_processes: 4").replace("use_cpu: false", "use_cpu: true")
    text = text.replace("mixed_precision: bf16", "mixed_precision: 'no'")
    text = re.sub(r"megatron_lm_tp_degree: \d+", f"megatron_lm_tp_degree: {tp}", text)
    return re.sub(r"megatron_lm_pp_degree: \d+", f"megatron_lm_pp_degree: {pp}", text)


def run(work: Path, name: str, cfg: str, extra: list[str], env: dict, timeout: float) -> tuple[str, str | None]:
    (work / f"{name}.yaml").write_text(cfg)
    args = [a.format(models=work / "models", data=work / "data") for a in ARGS]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--config_file", str(work / f"{name}.yaml"),
                           str(work / "run_clm_no_trainer.py"), *args, *extra], cwd=work, env=env,
                          capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    losses = re.findall(r"eval_loss: ([0-9.e-]+)", output)
    batch = re.findall(r"Total train batch size.*= (\d+)", output)
    problem = None if proc.returncode == 0 else (hf_examples.last_error(output) or f"exit {proc.returncode}")
    print(f"  {name}: {'ok' if problem is None else 'FAIL'} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return (f"{float(losses[-1]):.6f}" if losses else "-") + (f" (batch {batch[-1]})" if batch else ""), problem


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-src", required=True, help="pacman100/accelerate-megatron-test's src folder")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    src = Path(args.megatron_src).resolve()
    src = src / "src" if (src / "src").is_dir() else src
    work = Path(tempfile.mkdtemp(prefix="hpc-megatron-seed-"))
    try:
        script = (src / "Training" / "run_clm_no_trainer.py").read_text()
        for old, new in DRIFT:
            script = script.replace(old, new)
        (work / "run_clm_no_trainer.py").write_text(hf_examples.as_hpc(script))
        page = (src / "Configs" / "megatron_lm_gpt_config.yaml").read_text()
        hf_examples.build_models(work / "models", work / "hf" / "hub")
        build_gpt2(work / "models")
        rng = random.Random(1)
        (work / "data").mkdir()
        for split, n in (("train", 96), ("validation", 64)):
            (work / "data" / f"lm_{split}.txt").write_text("\n".join(hf_examples.sentence(rng) for _ in range(n)))
        env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "HF_STAND_IN_REPOSITORY": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), str(hf_examples.STAND_INS)])}
        rows = []
        for model in ("llama", "gpt2"):
            for name, (tp, pp) in LAYOUTS.items():
                batch = GLOBAL_BATCH // (4 // (tp * pp))  # a data rank's batch: the global batch over the data ranks
                extra = ["--per_device_train_batch_size", str(batch), "--per_device_eval_batch_size", str(batch),
                         "--output_dir", str(work / f"out-{model}-{tp}-{pp}"), "--model_name_or_path",
                         str(work / "models" / model)]
                label = f"{'GPT-2 (fused q/k/v, tied head)' if model == 'gpt2' else 'Llama'}, {name}"
                rows.append((label, *run(work, f"{model}-{tp}-{pp}", config(page, tp, pp), extra, env,
                                         args.timeout)))
        extra = ["--per_device_train_batch_size", str(GLOBAL_BATCH), "--per_device_eval_batch_size", str(GLOBAL_BATCH),
                 "--output_dir", str(work / "resumed"), "--model_name_or_path", str(work / "models" / "gpt2"),
                 "--resume_from_checkpoint", str(work / "out-gpt2-2-2" / "step_2")]
        rows.append(("GPT-2, tp2 x pp2 (sp), resumed from step_2", *run(work, "resumed", config(page, 2, 2), extra, env,
                                                                   args.timeout)))
        saved = sorted(p.name for p in (work / "resumed").glob("step_*")) if (work / "resumed").exists() else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| layout (4 CPU processes) | eval loss after 6 steps (global batch) | result |")
    print("|---|---|---|")
    for name, loss, problem in rows:
        print(f"| {name} | {loss} | {'ok' if problem is None else 'fails: ' + problem} |")
    print(f"\nthe resumed run wrote {', '.join(saved) or 'nothing'} (from step_2: step_4 and step_6 only)")
    return 0 if all(p is None for _, _, p in rows) and saved == ["step_4", "step_6"] else 1


if __name__ == "__main__":
    sys.exit(main())
