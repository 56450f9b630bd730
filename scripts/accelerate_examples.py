#!/usr/bin/env python3
"""Run Accelerate's example scripts under hpc with only `accelerate` replaced by `hpc` in their imports, and,
with --accelerate-pkg, the same scripts unchanged under Accelerate, side by side.

The examples download bert-base-cased, SmolLM-360M, GLUE/MRPC, wikitext and the GLUE metric from the Hugging Face
Hub. This machine cannot reach it, so the harness stands in for the Hub, and only for it:
- a Hub cache (HF_HOME, HF_HUB_OFFLINE=1) holding tiny random models under those names, with a word-level
  tokenizer built from the sentences of Accelerate's tests/test_samples/MRPC;
- `datasets.load_dataset` of GLUE/MRPC and wikitext answered from 256 sentence pairs made of those sentences;
- `evaluate.load("glue", "mrpc")` answered by a small accuracy/F1 metric.
Everything else (the training loops, Accelerate's or hpc's code, torch, transformers, datasets) is real. Scores
are meaningless (random tiny models); what is measured is whether a script runs to the end and does what
Accelerate's own tests check (checkpoint folders, resuming at the next epoch).

    git -C ACCELERATE_REPO archive v1.15.0 examples tests/test_samples | tar x -C /tmp/acc-src
    python scripts/accelerate_examples.py --accelerate-src /tmp/acc-src
    pip install --no-deps --target /tmp/acc-pkg accelerate==1.15.0
    python scripts/accelerate_examples.py --accelerate-src /tmp/acc-src --accelerate-pkg /tmp/acc-pkg

Accelerate's example sources are read from the given folder and never copied into this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMPORT_LINE = re.compile(r"^(\s*)(from|import)\s+accelerate(?=[\s.])", re.MULTILINE)

# (label, script, arguments, what must be true afterwards); {out} is a scratch folder shared by one example's runs
EXAMPLES = [
    ("nlp_example", "nlp_example.py", [], None),
    ("complete_nlp_example", "complete_nlp_example.py", ["--checkpointing_steps", "epoch", "--output_dir", "{out}"],
     "epoch_0"),
    ("checkpointing by epoch", "by_feature/checkpointing.py",
     ["--checkpointing_steps", "epoch", "--output_dir", "{out}"], "epoch_0"),
    ("checkpointing: resume from epoch_0", "by_feature/checkpointing.py",
     ["--resume_from_checkpoint", "{out}/epoch_0"], "resumed at epoch 1"),
    ("checkpointing by steps", "by_feature/checkpointing.py", ["--checkpointing_steps", "1", "--output_dir", "{out}"],
     "step_2"),
    ("checkpointing: resume from step_2", "by_feature/checkpointing.py",
     ["--resume_from_checkpoint", "{out}/step_2"], None),
    ("gradient_accumulation", "by_feature/gradient_accumulation.py", [], None),
    ("gradient_accumulation_for_autoregressive_models",
     "by_feature/gradient_accumulation_for_autoregressive_models.py", ["--gradient_accumulation_steps", "2"], None),
    ("tracking", "by_feature/tracking.py", ["--with_tracking", "--project_dir", "{out}"], None),
    ("multi_process_metrics", "by_feature/multi_process_metrics.py", [], None),
    ("early_stopping", "by_feature/early_stopping.py", [], None),
    ("memory", "by_feature/memory.py", [], None),
    ("automatic_gradient_accumulation", "by_feature/automatic_gradient_accumulation.py", [], None),
    ("local_sgd", "by_feature/local_sgd.py", [], None),
    ("cross_validation", "by_feature/cross_validation.py", ["--num_folds", "2"], None),
    ("profiler", "by_feature/profiler.py", [], None),
    ("schedule_free", "by_feature/schedule_free.py", [], None),
    ("ddp_comm_hook", "by_feature/ddp_comm_hook.py", ["--ddp_comm_hook", "fp16"], None),
    ("deepspeed_with_config_support", "by_feature/deepspeed_with_config_support.py",
     ["--model_name_or_path", "HuggingFaceTB/SmolLM-360M", "--train_file", "{data}/wikitext.txt",
      "--validation_file", "{data}/wikitext.txt", "--block_size", "16", "--per_device_train_batch_size", "2",
      "--per_device_eval_batch_size", "2", "--num_train_epochs", "1", "--output_dir", "{out}"], None),
]

SITECUSTOMIZE = r'''
# Stands in for the Hugging Face Hub's datasets (this machine cannot reach it); see scripts/accelerate_examples.py.
import os
if os.environ.get("HUB_STAND_IN"):
    import datasets as _datasets

    _real_load = _datasets.load_dataset

    def _stand_in(path=None, name=None, *args, **kwargs):
        folder = os.environ["HUB_STAND_IN"]
        if str(path).split("/")[-1] == "glue" and (name or kwargs.get("name")) == "mrpc":
            return _real_load("json", data_files={"train": f"{folder}/mrpc_train.jsonl",
                                                  "validation": f"{folder}/mrpc_validation.jsonl",
                                                  "test": f"{folder}/mrpc_validation.jsonl"}).cast_column(
                "label", _datasets.ClassLabel(names=["not_equivalent", "equivalent"]))
        if str(path).split("/")[-1] == "wikitext":
            return _real_load("text", data_files={"train": f"{folder}/wikitext.txt",
                                                  "validation": f"{folder}/wikitext.txt",
                                                  "test": f"{folder}/wikitext.txt"})
        return _real_load(path, name, *args, **kwargs)

    _datasets.load_dataset = _stand_in
'''

EVALUATE = r'''
"""Stands in for `evaluate` (its metrics are downloaded from the Hub): GLUE/MRPC's accuracy and F1, accuracy."""


class _Metric:
    def __init__(self):
        self.predictions, self.references = [], []

    def add_batch(self, predictions=None, references=None):
        self.predictions += [int(p) for p in predictions]
        self.references += [int(r) for r in references]

    def compute(self, predictions=None, references=None):
        if predictions is not None:
            self.add_batch(predictions, references)
        pairs = list(zip(self.predictions, self.references))
        self.predictions, self.references = [], []
        true_pos = sum(1 for p, r in pairs if p == r == 1)
        precision = true_pos / max(1, sum(p for p, _ in pairs))
        recall = true_pos / max(1, sum(r for _, r in pairs))
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"accuracy": sum(p == r for p, r in pairs) / max(1, len(pairs)), "f1": f1}


def load(path, config_name=None, **kwargs):
    return _Metric()
'''


def build_stand_ins(src: Path, work: Path) -> dict:
    """The Hub cache, the datasets and the offline modules; returns the environment the runs need."""
    import csv
    import random

    rows = []
    for split in ("train", "dev"):
        with open(src / "tests" / "test_samples" / "MRPC" / f"{split}.csv") as f:
            rows += list(csv.DictReader(f))
    sentences = sorted({r["sentence1"] for r in rows} | {r["sentence2"] for r in rows})
    words = sorted({w for s in sentences for w in s.split()})
    data = work / "data"
    data.mkdir()
    rng = random.Random(0)

    def pairs(n):
        out = []
        for i in range(n):
            first = rng.choice(sentences)
            same = rng.random() < 0.5
            second = " ".join(rng.sample(first.split(), len(first.split()))) if same else rng.choice(sentences)
            out.append({"sentence1": first, "sentence2": second, "label": int(same), "idx": i})
        return out

    for split, n in (("train", 256), ("validation", 64)):
        with open(data / f"mrpc_{split}.jsonl", "w") as f:
            f.writelines(json.dumps(p) + "\n" for p in pairs(n))
    (data / "wikitext.txt").write_text("\n".join(rng.choice(sentences) for _ in range(2000)) + "\n")

    offline = work / "offline"
    offline.mkdir()
    (offline / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (offline / "evaluate.py").write_text(EVALUATE)

    hub = work / "hf" / "hub"
    build_models(hub, words)
    return {"HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "HUB_STAND_IN": str(data), "WANDB_MODE": "offline",
            "HF_DATASETS_CACHE": str(work / "hf" / "datasets"), "TOKENIZERS_PARALLELISM": "false"}


def snapshot(hub: Path, repo: str, kind: str = "models") -> Path:
    """A folder in the offline Hub cache that `hf_hub_download(repo, ...)` finds with HF_HUB_OFFLINE=1."""
    folder = hub / f"{kind}--{repo.replace('/', '--')}"
    revision = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    path = folder / "snapshots" / revision
    path.mkdir(parents=True)
    return path


def build_models(hub: Path, words: list[str]) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    vocab = hub / "vocab.txt"
    vocab.parent.mkdir(parents=True, exist_ok=True)
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    size = len(words) + 5

    bert = snapshot(hub, "bert-base-cased")
    BertTokenizerFast(vocab_file=str(vocab), do_lower_case=False).save_pretrained(bert)
    BertForSequenceClassification(BertConfig(vocab_size=size, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=64,
                                             max_position_embeddings=512)).save_pretrained(bert)

    smol = snapshot(hub, "HuggingFaceTB/SmolLM-360M")
    BertTokenizerFast(vocab_file=str(vocab), do_lower_case=False, eos_token="[SEP]", bos_token="[CLS]",
                      model_max_length=512).save_pretrained(smol)
    LlamaForCausalLM(LlamaConfig(vocab_size=size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512,
                                 eos_token_id=3, bos_token_id=2, pad_token_id=0)).save_pretrained(smol)


def as_hpc(source: str) -> str:
    return IMPORT_LINE.sub(lambda m: f"{m.group(1)}{m.group(2)} hpc", source)


def copy_examples(src: Path, dest: Path, rewrite: bool) -> None:
    shutil.copytree(src / "tests" / "test_samples", dest / "tests" / "test_samples")
    for _, script, _, _ in EXAMPLES:
        text = (src / "examples" / script).read_text()
        target = dest / script
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(as_hpc(text) if rewrite else text)


def check(expect: str | None, out: Path, output: str) -> str | None:
    """What Accelerate's own tests check after the run; None when it holds."""
    if expect is None:
        return None
    if expect == "resumed at epoch 1":
        return None if ("epoch 1:" in output and "epoch 0:" not in output) else "did not resume at epoch 1"
    return None if (out / expect).exists() else f"no {expect} folder"


def launch(framework: str, processes: int, script: str, args: list[str], env: dict, pythonpath: list[str],
           cwd: Path, timeout: float) -> tuple[str, int | str]:
    """One run of ``script`` on ``processes`` CPU processes: under hpc (`hpc launch`) or Accelerate (`accelerate
    launch`); its output and exit code ("timeout" when it ran out of time). Also scripts/hf_examples.py's."""
    if framework == "hpc":
        command = [sys.executable, "-m", "hpc", "launch", "--cpu", "--num_processes", str(processes), script, *args]
    else:
        # `accelerate launch --cpu --num_processes 2` starts ONE process on a machine without GPUs (its multi-CPU
        # launch is mpirun with a hostfile); --multi_gpu starts torchrun's 2, and ACCELERATE_USE_CPU=1 makes each
        # one join a gloo group as MULTI_CPU
        command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                   str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   script, *args]
    run_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(pythonpath), "OMP_NUM_THREADS": "1",
               **({"ACCELERATE_USE_CPU": "1"} if framework == "accelerate" else {})}
    try:
        run = subprocess.run(command, cwd=cwd, env=run_env, capture_output=True, text=True, timeout=timeout)
        return run.stdout + run.stderr, run.returncode
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode(errors="replace") + (expired.stderr or b"").decode(errors="replace")
        return output, "timeout"


def run_all(framework: str, root: Path, env: dict, processes: int, timeout: float, only: list[str] | None,
            pythonpath: list[str]) -> list[dict]:
    results, scratch = [], {}
    for label, script, arguments, expect in EXAMPLES:
        if only and not any(o in label for o in only):
            continue
        out = scratch.setdefault(script, Path(tempfile.mkdtemp(prefix="example-", dir=root)))
        args = [a.format(out=out, data=env["HUB_STAND_IN"]) for a in arguments]
        started = time.monotonic()
        output, code = launch(framework, processes, script, args, env, pythonpath, root, timeout)
        problem = f"exit {code}" if code != 0 else check(expect, out, output)
        errors = [line.strip() for line in output.splitlines() if re.search(r"(Error|Exception)\b", line)
                  and not line.lstrip().startswith("warnings.warn")]
        results.append({"example": label, "ok": problem is None, "seconds": round(time.monotonic() - started, 1),
                        "problem": problem, "error": errors[-1][:300] if problem and errors else None,
                        "output_tail": output[-8000:]})
        print(f"  {framework:10s} {'ok  ' if problem is None else 'FAIL'} {label} ({results[-1]['seconds']} s)"
              + (f": {problem}; {results[-1]['error']}" if problem else ""), file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accelerate-src", required=True, help="a folder with Accelerate's examples/ and tests/")
    parser.add_argument("--accelerate-pkg", help="a folder Accelerate is installed in (pip --target): also run "
                                                 "the unchanged examples under Accelerate")
    parser.add_argument("--only", action="append", help="examples whose label contains this (repeatable)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    src = Path(args.accelerate_src)
    work = Path(tempfile.mkdtemp(prefix="hpc-examples-"))
    try:
        env = build_stand_ins(src, work)
        offline = str(work / "offline")
        report = {}
        copy_examples(src, work / "hpc", rewrite=True)
        report["hpc"] = run_all("hpc", work / "hpc", env, args.processes, args.timeout, args.only, [offline])
        if args.accelerate_pkg:
            copy_examples(src, work / "accelerate", rewrite=False)
            report["accelerate"] = run_all("accelerate", work / "accelerate", env, args.processes, args.timeout,
                                           args.only, [offline, str(Path(args.accelerate_pkg).resolve())])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    frameworks = list(report)
    print(f"\n| example | {' | '.join(frameworks)} |\n|---|{'---|' * len(frameworks)}")
    for i, row in enumerate(report["hpc"]):
        cells = []
        for name in frameworks:
            r = report[name][i]
            cells.append(f"ok ({r['seconds']} s)" if r["ok"] else f"fails: {r['problem']}")
        print(f"| {row['example']} | {' | '.join(cells)} |")
    for name in frameworks:
        print(f"\n{name}: {sum(r['ok'] for r in report[name])} of {len(report[name])} run "
              f"({args.processes} CPU processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
