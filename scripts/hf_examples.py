#!/usr/bin/env python3
"""Run third-party training scripts written for Accelerate (transformers' `run_*_no_trainer.py`, diffusers'
`train_unconditional.py`) on CPU processes under hpc, with only `accelerate` replaced by `hpc` in their imports,
and, with --accelerate-pkg, the same scripts unchanged under Accelerate, side by side.

Each script is run twice: with tracking (TensorBoard) and checkpoints every 2 steps, then resumed from its step_4
checkpoint into a new folder (diffusers: from `latest`, one more epoch, in the same folder). What is checked
afterwards is what the scripts promise: the checkpoint folders, TensorBoard event files, and that the resumed run
carries on at step 5 (it writes step_6 and step_8, not step_2 or step_4; diffusers: a later checkpoint).

The scripts download models, datasets, metrics and nltk data from the Hugging Face Hub. This machine cannot reach
it, so the harness stands in for the Hub, and only for it:
- tiny random models (BERT, Llama, T5, ViT, SegFormer) saved to local folders, with a word-level tokenizer built
  with the `tokenizers` library, passed as --model_name_or_path;
- a few dozen made-up rows per task as --train_file/--validation_file (csv/json/txt) or image folders; the
  segmentation dataset and its id2label.json answer `load_dataset`/`hf_hub_download` of a made-up repo id from a
  local parquet folder and an offline Hub cache (HF_HUB_OFFLINE=1);
- scripts/hf_stand_ins/: `evaluate` (metrics come from the Hub), nltk (punkt comes from the Hub) and
  huggingface_hub.Repository (gone since huggingface_hub 1.0, imported at the top of run_fim_no_trainer.py);
  for the image scripts only, vision/: torchvision.transforms and albumentations (torchvision's only wheel for
  this torch is a CUDA build; albumentations needs OpenCV).
The scripts are a few versions older than the transformers installed here; the few lines that fail under any
framework (DRIFT below: `DistributedType.TPU`, transformers.utils.is_offline_mode, run_fim's embedding statistics)
are changed in both copies alike.
Everything else (the training loops, Accelerate's or hpc's code, torch, transformers, datasets, diffusers) is
real. Scores are meaningless (random tiny models).

    git --git-dir=$(fetch PerforatedAI/PerforatedAI-Transformers) archive HEAD examples/pytorch \\
        | tar x -C /tmp/tf-src                                        # upstream transformers' examples/pytorch
    git --git-dir=$(fetch huggingface/diffusers) archive HEAD examples/unconditional_image_generation \\
        | tar x -C /tmp/diff-src
    pip install --no-deps --target /tmp/acc-pkg accelerate==1.15.0
    pip install --no-deps --target /tmp/diffusers-pkg diffusers   # on PYTHONPATH of both sides, not in the venv
    .venv/bin/python scripts/hf_examples.py --transformers-src /tmp/tf-src --diffusers-src /tmp/diff-src \\
        --diffusers-pkg /tmp/diffusers-pkg --accelerate-pkg /tmp/acc-pkg [--only glue --only clm]

The scripts' sources are read from the given folders and never copied into this repository.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from accelerate_examples import launch, snapshot  # this folder is on sys.path when the script runs

STAND_INS = Path(__file__).resolve().parent / "hf_stand_ins"
# Only the image scripts get these: with any `torchvision` importable, transformers takes it for the real one.
VISION = {"image_classification", "semantic_segmentation", "diffusers_unconditional"}
FROM_LINE = re.compile(r"^(\s*)from\s+accelerate(?=[\s.])", re.MULTILINE)
# `import accelerate` alone: the scripts go on to read `accelerate.__version__`, so the module keeps its name.
IMPORT_LINE = re.compile(r"^(\s*)import\s+accelerate\s*$", re.MULTILINE)
# Lines of the scripts that fail under any framework with the transformers installed here (the scripts are a few
# versions older) or for any model: changed alike in both copies, so that what follows them is compared too.
DRIFT = [
    ("DistributedType.TPU", "DistributedType.XLA"),  # renamed in Accelerate 0.28
    # transformers 5 dropped it from transformers.utils; the script imports huggingface_hub's one line above
    ("from transformers.utils import check_min_version, is_offline_mode",
     "from transformers.utils import check_min_version"),
    # run_fim_no_trainer.py takes .mean() of the embedding module itself (its deepspeed branch reads .weight)
    ("        original_embeddings = model.get_input_embeddings()\n        # Get",
     "        original_embeddings = model.get_input_embeddings().weight.detach().clone()\n        # Get"),
]

COMMON = ["--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2", "--max_train_steps", "8",
          "--seed", "0", "--with_tracking", "--report_to", "tensorboard", "--checkpointing_steps", "2"]
TEXT_PAIRS = ["--train_file", "{data}/pairs_train.csv", "--validation_file", "{data}/pairs_validation.csv"]
LM = ["--model_name_or_path", "{models}/llama", "--train_file", "{data}/lm_train.txt",
      "--validation_file", "{data}/lm_validation.txt", "--block_size", "16"]
# (name, source folder, script, arguments): one line per script, each run twice (train, resume)
TRANSFORMERS = [
    ("glue", "text-classification", "run_glue_no_trainer.py",
     ["--model_name_or_path", "{models}/bert", *TEXT_PAIRS, "--max_length", "32"]),
    ("clm", "language-modeling", "run_clm_no_trainer.py", LM),
    ("mlm", "language-modeling", "run_mlm_no_trainer.py",
     ["--model_name_or_path", "{models}/bert", "--train_file", "{data}/lm_train.txt",
      "--validation_file", "{data}/lm_validation.txt", "--max_seq_length", "16"]),
    ("fim", "language-modeling", "run_fim_no_trainer.py", LM),
    ("ner", "token-classification", "run_ner_no_trainer.py",
     ["--model_name_or_path", "{models}/bert", "--train_file", "{data}/ner_train.json",
      "--validation_file", "{data}/ner_validation.json", "--text_column_name", "tokens",
      "--label_column_name", "ner_tags", "--max_length", "32"]),
    ("swag", "multiple-choice", "run_swag_no_trainer.py",
     ["--model_name_or_path", "{models}/bert", "--train_file", "{data}/swag_train.csv",
      "--validation_file", "{data}/swag_validation.csv", "--max_seq_length", "32"]),
    ("qa", "question-answering", "run_qa_no_trainer.py",
     ["--model_name_or_path", "{models}/bert", "--train_file", "{data}/qa_train.json",
      "--validation_file", "{data}/qa_validation.json", "--max_seq_length", "64", "--doc_stride", "16"]),
    ("summarization", "summarization", "run_summarization_no_trainer.py",
     ["--model_name_or_path", "{models}/t5", *TEXT_PAIRS, "--text_column", "sentence1", "--summary_column",
      "sentence2", "--max_source_length", "32", "--max_target_length", "16", "--val_max_target_length", "8",
      "--num_beams", "1"]),
    ("translation", "translation", "run_translation_no_trainer.py",
     ["--model_name_or_path", "{models}/t5", "--train_file", "{data}/translation_train.json",
      "--validation_file", "{data}/translation_validation.json", "--source_lang", "en", "--target_lang", "ro",
      "--max_source_length", "32", "--max_target_length", "16", "--val_max_target_length", "8", "--num_beams", "1"]),
    ("image_classification", "image-classification", "run_image_classification_no_trainer.py",
     # its --train_dir is read only without --dataset_name, whose default is cifar10: a stand-in name instead
     ["--model_name_or_path", "{models}/vit", "--dataset_name", "stand-in/images"]),
    ("semantic_segmentation", "semantic-segmentation", "run_semantic_segmentation_no_trainer.py",
     ["--model_name_or_path", "{models}/segformer", "--dataset_name", "stand-in/segmentation"]),
]
DIFFUSERS_ARGS = ["--train_data_dir", "{data}/images_unlabelled", "--model_config_name_or_path",
                  "{models}/unet/config.json", "--resolution", "16", "--train_batch_size", "2", "--eval_batch_size",
                  "2", "--ddpm_num_steps", "10", "--ddpm_num_inference_steps", "2", "--save_images_epochs", "100",
                  "--save_model_epochs", "100", "--logger", "tensorboard", "--checkpointing_steps", "2",
                  "--lr_warmup_steps", "0", "--output_dir", "{out}/run"]

WORDS = [a + b for a in ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "we", "zo") for b in
         ("b", "d", "g", "k", "l", "m", "n", "p", "r", "s", "t", "x")]


def sentence(rng: random.Random, low: int = 6, high: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) + "."


def build_data(data: Path) -> None:
    import csv

    from PIL import Image

    rng = random.Random(0)
    data.mkdir()

    def image(size: int, mode: str = "RGB", values: int = 256) -> Image.Image:
        channels = 3 if mode == "RGB" else 1
        return Image.frombytes(mode, (size, size), bytes(rng.randrange(values) for _ in range(size * size * channels)))

    for split, n in (("train", 24), ("validation", 8)):
        rows = [{"sentence1": sentence(rng), "sentence2": sentence(rng, 3, 5), "label": rng.randint(0, 1)}
                for _ in range(n)]
        with open(data / f"pairs_{split}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, ["sentence1", "sentence2", "label"])
            writer.writeheader()
            writer.writerows(rows)
        # about 2 tokens a word: 16-token blocks come to ~5 batches of 2 a process and epoch at 24 lines
        (data / f"lm_{split}.txt").write_text("\n".join(sentence(rng) for _ in range(n)) + "\n")
        with open(data / f"ner_{split}.json", "w") as f:
            for _ in range(n):
                tokens = sentence(rng).rstrip(".").split()
                f.write(json.dumps({"tokens": tokens, "ner_tags": [rng.choice(["O", "B-X", "I-X"]) for _ in tokens]})
                        + "\n")
        with open(data / f"swag_{split}.csv", "w", newline="") as f:
            fields = ["sent1", "sent2", *(f"ending{i}" for i in range(4)), "label"]
            writer = csv.DictWriter(f, fields)
            writer.writeheader()
            for _ in range(n):
                writer.writerow({"sent1": sentence(rng), "sent2": sentence(rng, 2, 3).rstrip("."),
                                 **{f"ending{i}": sentence(rng, 2, 4) for i in range(4)}, "label": rng.randint(0, 3)})
        with open(data / f"qa_{split}.json", "w") as f:
            rows = []
            for i in range(n):
                context = sentence(rng, 15, 25)
                words = context.rstrip(".").split()
                start = rng.randint(0, len(words) - 3)
                answer = " ".join(words[start:start + 2])
                rows.append({"id": f"{split}-{i}", "title": "t", "context": context, "question": sentence(rng, 3, 5),
                             "answers": {"text": [answer], "answer_start": [context.index(answer)]}})
            json.dump({"data": rows}, f)
        with open(data / f"translation_{split}.json", "w") as f:
            f.writelines(json.dumps({"translation": {"en": sentence(rng), "ro": sentence(rng)}}) + "\n"
                         for _ in range(n))

        for label in ("cat", "dog"):
            folder = data / "images" / split / label
            folder.mkdir(parents=True)
            for i in range(n // 2):
                image(20).save(folder / f"{i}.png")
    unlabelled = data / "images_unlabelled"
    unlabelled.mkdir()
    for i in range(12):
        image(16).save(unlabelled / f"{i}.png")

    import datasets

    segmentation = data / "segmentation"
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Image()})
    for split, n in (("train", 24), ("validation", 8)):
        rows = {"image": [image(40) for _ in range(n)], "label": [image(40, "L", 3) for _ in range(n)]}
        datasets.Dataset.from_dict(rows, features=features).to_parquet(str(segmentation / f"{split}.parquet"))


def build_models(models: Path, hub: Path) -> None:
    import torch
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertTokenizerFast,
        LlamaConfig,
        LlamaForCausalLM,
        SegformerConfig,
        SegformerForSemanticSegmentation,
        SegformerImageProcessor,
        T5Config,
        T5ForConditionalGeneration,
        ViTConfig,
        ViTForImageClassification,
        ViTImageProcessor,
    )

    torch.manual_seed(0)
    models.mkdir()
    vocab = models / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]) + "\n")
    size = len(WORDS) + 6
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}

    def tokenizer(folder: Path, **kwargs) -> None:
        BertTokenizerFast(vocab_file=str(vocab), model_max_length=128, **kwargs).save_pretrained(folder)

    tokenizer(models / "bert")
    BertForMaskedLM(BertConfig(vocab_size=size, max_position_embeddings=128, **small)).save_pretrained(
        models / "bert")
    tokenizer(models / "llama", bos_token="[CLS]", eos_token="[SEP]")
    LlamaForCausalLM(LlamaConfig(vocab_size=size, max_position_embeddings=128, num_key_value_heads=2, bos_token_id=2,
                                 eos_token_id=3, pad_token_id=0, **small)).save_pretrained(models / "llama")
    tokenizer(models / "t5", eos_token="[SEP]")
    T5ForConditionalGeneration(T5Config(vocab_size=size, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                        decoder_start_token_id=0, pad_token_id=0, eos_token_id=3)).save_pretrained(
        models / "t5")
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(models / "vit")
    ViTForImageClassification(ViTConfig(image_size=16, patch_size=8, **small)).save_pretrained(models / "vit")
    SegformerImageProcessor(size={"height": 32, "width": 32}).save_pretrained(models / "segformer")
    SegformerForSemanticSegmentation(SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
        strides=[4, 2], num_attention_heads=[1, 1], mlp_ratios=[2, 2], decoder_hidden_size=16,
        num_labels=3)).save_pretrained(models / "segformer")
    (models / "unet").mkdir()
    (models / "unet" / "config.json").write_text(json.dumps({
        "_class_name": "UNet2DModel", "sample_size": 16, "in_channels": 3, "out_channels": 3, "layers_per_block": 1,
        "block_out_channels": [8, 16], "norm_num_groups": 4, "down_block_types": ["DownBlock2D", "AttnDownBlock2D"],
        "up_block_types": ["AttnUpBlock2D", "UpBlock2D"], "attention_head_dim": 8}))
    labels = snapshot(hub, "stand-in/segmentation", "datasets")
    (labels / "id2label.json").write_text(json.dumps({"0": "background", "1": "thing", "2": "stuff"}))


def as_hpc(source: str) -> str:
    source = FROM_LINE.sub(lambda m: f"{m.group(1)}from hpc", source)
    return IMPORT_LINE.sub(lambda m: f"{m.group(1)}import hpc as accelerate", source)


def copy_scripts(tf_src: Path | None, diff_src: Path | None, dest: Path, rewrite: bool) -> None:
    """Each script's whole folder (run_qa_no_trainer.py imports utils_qa.py beside it)."""
    folders = {(tf_src / "examples" / "pytorch" / folder) for _, folder, _, _ in TRANSFORMERS} if tf_src else set()
    if diff_src:
        folders.add(diff_src / "examples" / "unconditional_image_generation")
    for folder in folders:
        target = dest / folder.name
        shutil.copytree(folder, target)
        for script in target.glob("*.py"):
            text = script.read_text()
            for old, new in DRIFT:
                text = text.replace(old, new)
            script.write_text(as_hpc(text) if rewrite else text)


def runs(only: list[str] | None, have_tf: bool, have_diffusers: bool) -> list[tuple]:
    """(name, run, folder, script, arguments, check) in order; {out} is one script's scratch folder."""
    plan = []
    for name, folder, script, arguments in TRANSFORMERS if have_tf else []:
        plan.append((name, "train", folder, script, [*arguments, *COMMON, "--output_dir", "{out}/run"], "train"))
        plan.append((name, "resume step_4", folder, script,
                     [*arguments, *COMMON, "--output_dir", "{out}/resumed", "--resume_from_checkpoint",
                      "{out}/run/step_4"], "resume"))
    if have_diffusers:
        folder, script = "unconditional_image_generation", "train_unconditional.py"
        plan.append(("diffusers_unconditional", "train", folder, script, [*DIFFUSERS_ARGS, "--num_epochs", "2"],
                     "diffusers train"))
        plan.append(("diffusers_unconditional", "resume latest", folder, script,
                     [*DIFFUSERS_ARGS, "--num_epochs", "3", "--resume_from_checkpoint", "latest"], "diffusers resume"))
    return [p for p in plan if not only or any(o in p[0] for o in only)]


def events(folder: Path) -> list[str]:
    """Folders holding TensorBoard event files; Accelerate's hparams go to a folder named by the time."""
    found = {re.sub(r"(^|/)\d+\.\d+(?=/|$)", r"\1<time>", str(p.parent.relative_to(folder)))
             for p in folder.rglob("events.out.tfevents*")} if folder.exists() else set()
    return sorted(found)


def check(kind: str, out: Path, output: str) -> str | None:
    """What the script promises after the run; None when it holds."""
    def missing(folder: Path, names: list[str]) -> list[str]:
        return [n for n in names if not (folder / n).exists()]

    if kind == "train":
        lacking = missing(out / "run", ["step_2", "step_4", "step_8"])
        if lacking:
            return f"no {', '.join(lacking)}"
        return None if events(out / "run") else "no TensorBoard events"
    if kind == "resume":
        lacking = missing(out / "resumed", ["step_6", "step_8"])
        extra = [n for n in ("step_2", "step_4") if (out / "resumed" / n).exists()]
        if lacking or extra:
            return f"resumed wrong: {'no ' + ', '.join(lacking) if lacking else ''} " \
                   f"{'also ' + ', '.join(extra) if extra else ''}".strip()
        return None
    if kind == "diffusers train":
        lacking = missing(out / "run", ["checkpoint-2", "checkpoint-4", "unet"])
        return f"no {', '.join(lacking)}" if lacking else None
    if kind == "diffusers resume":
        resumed = re.search(r"Resuming from checkpoint checkpoint-(\d+)", output)
        if not resumed:
            return "did not resume"
        later = [p for p in (out / "run").glob("checkpoint-*") if int(p.name.split("-")[1]) > int(resumed[1])]
        return None if later else f"no checkpoint after checkpoint-{resumed[1]}"
    raise ValueError(kind)


def ranks(output: str, processes: int) -> str | None:
    """The scripts log their total batch: per-process batch (2 here) times processes; a launcher that started
    fewer processes than asked shows there."""
    totals = {int(n) for n in re.findall(r"Total train batch size \(w\. parallel.*= (\d+)", output)}
    return f"ran on {min(totals) // 2} process(es), not {processes}" if totals and totals != {2 * processes} else None


def last_error(output: str) -> str | None:
    # the launchers' own CalledProcessError/ChildFailedError, and the gloo error of a rank whose peer crashed, come
    # after the failing rank's own error and say only that some rank failed
    lines = [line.strip() for line in output.splitlines()
             if re.search(r"(Error|Exception)\b", line) and not line.lstrip().startswith("warnings.warn")
             and "Warning" not in line.split(":")[0]
             and not re.search(r"CalledProcessError|ChildFailedError|exited with status|Connection closed by peer",
                               line)]
    return lines[-1][:400] if lines else None


def run_all(framework: str, root: Path, env: dict, plan: list[tuple], processes: int, timeout: float,
            pythonpath: list[str]) -> list[dict]:
    results, scratch = [], {}
    for name, label, folder, script, arguments, kind in plan:
        out = scratch.setdefault(name, Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root)))
        args = [a.format(out=out, data=env["STAND_IN_DATA"], models=env["STAND_IN_MODELS"]) for a in arguments]
        path = [str(STAND_INS / "vision")] * (name in VISION) + pythonpath
        started = time.monotonic()
        output, code = launch(framework, processes, script, args, env, path, root / folder, timeout)
        problem = f"exit {code}" if code != 0 else check(kind, out, output) or ranks(output, processes)
        results.append({"script": name, "run": label, "ok": problem is None, "problem": problem,
                        "seconds": round(time.monotonic() - started, 1),
                        "error": last_error(output) if problem else None,
                        "events": events(out / ("resumed" if kind == "resume" else "run")),
                        "output_tail": output[-8000:]})
        print(f"  {framework:10s} {'ok  ' if problem is None else 'FAIL'} {name} / {label} "
              f"({results[-1]['seconds']} s)" + (f": {problem}; {results[-1]['error']}" if problem else ""),
              file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transformers-src", help="a folder with transformers' examples/pytorch")
    parser.add_argument("--diffusers-src", help="a folder with diffusers' examples/unconditional_image_generation")
    parser.add_argument("--diffusers-pkg", help="a folder diffusers is installed in (pip --target)")
    parser.add_argument("--accelerate-pkg", help="a folder Accelerate is installed in (pip --target): also run "
                                                 "the unchanged scripts under Accelerate")
    parser.add_argument("--only", action="append", help="scripts whose name contains this (repeatable)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (its path is printed)")
    parser.add_argument("--json", help="also write every run's result and output tail to this file")
    args = parser.parse_args(argv)
    if not args.transformers_src and not args.diffusers_src:
        parser.error("give --transformers-src, --diffusers-src or both")
    if args.diffusers_src and not args.diffusers_pkg:
        parser.error("--diffusers-src needs --diffusers-pkg")
    tf_src = Path(args.transformers_src).resolve() if args.transformers_src else None
    diff_src = Path(args.diffusers_src).resolve() if args.diffusers_src else None
    plan = runs(args.only, tf_src is not None, diff_src is not None)
    work = Path(tempfile.mkdtemp(prefix="hpc-hf-examples-"))
    print(f"scratch: {work}", file=sys.stderr)
    try:
        build_data(work / "data")
        build_models(work / "models", work / "hf" / "hub")
        env = {"HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_CACHE": str(work / "hf" / "datasets"),
               "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline", "HF_STAND_IN_REPOSITORY": "1",
               "HF_STAND_IN_DATASETS": json.dumps({"stand-in/segmentation": str(work / "data" / "segmentation"),
                                                   "stand-in/images": str(work / "data" / "images")}),
               "STAND_IN_DATA": str(work / "data"), "STAND_IN_MODELS": str(work / "models")}
        shared = [str(STAND_INS)] + ([str(Path(args.diffusers_pkg).resolve())] if args.diffusers_pkg else [])
        report = {}
        if args.accelerate_pkg:
            copy_scripts(tf_src, diff_src, work / "accelerate", rewrite=False)
            report["Accelerate"] = run_all("accelerate", work / "accelerate", env, plan, args.processes,
                                           args.timeout, [*shared, str(Path(args.accelerate_pkg).resolve())])
        copy_scripts(tf_src, diff_src, work / "hpc", rewrite=True)
        report["hpc"] = run_all("hpc", work / "hpc", env, plan, args.processes, args.timeout, shared)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    frameworks = list(report)
    print(f"\n| script | run | {' | '.join(frameworks)} | seconds ({' / '.join(frameworks)}) |")
    print(f"|---|---|{'---|' * len(frameworks)}---|")
    for i, row in enumerate(report["hpc"]):
        cells = [("ok" if report[f][i]["ok"] else f"fails: {report[f][i]['problem']}") for f in frameworks]
        seconds = " / ".join(str(report[f][i]["seconds"]) for f in frameworks)
        print(f"| {row['script']} | {row['run']} | {' | '.join(cells)} | {seconds} |")
    for name in frameworks:
        print(f"\n{name}: {sum(r['ok'] for r in report[name])} of {len(report[name])} runs ok "
              f"({args.processes} CPU processes)")
    failures = [r for r in report["hpc"] if not r["ok"]]
    if failures:
        print("\nhpc failures, last error line:")
        for r in failures:
            print(f"- {r['script']} / {r['run']}: {r['problem']}: `{r['error']}`")
    if "Accelerate" in report:
        differ = [(a, h) for a, h in zip(report["Accelerate"], report["hpc"]) if a["events"] != h["events"]]
        if differ:
            print("\nTensorBoard event folders (relative to --output_dir) that differ:")
            for a, h in differ:
                print(f"- {a['script']} / {a['run']}: Accelerate {a['events']}, hpc {h['events']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
