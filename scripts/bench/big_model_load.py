#!/usr/bin/env python3
"""Big-model inference: hpc.big_modeling beside Accelerate's own functions, on the same sharded checkpoint.

    python scripts/bench/big_model_load.py [--layers 8] [--width 768] [--repeat 3] [--accelerate-path /tmp/acc-pkg]

A GPT-2-style model (transformers.GPT2Config, untied lm_head; ~540 MB fp32 at the defaults) is saved once to a
temporary folder with save_pretrained(max_shard_size="100MB", safe_serialization=True): a sharded safetensors
checkpoint with model.safetensors.index.json. For each implementation (hpc; Accelerate when importable, from
--accelerate-path put on PYTHONPATH of its subprocesses only, so this venv never has it installed):

  load      the model built under init_empty_weights, then load_checkpoint_and_dispatch with a CPU+disk map
            (embeddings and the first half of the blocks "cpu", the rest, ln_f and lm_head "disk"), timed, with
            the process's peak RSS (VmHWM) and its growth over the RSS before the load (torch and transformers
            already imported). Each run is a fresh subprocess, so the peak is that run's alone.
  cpu/disk  greedy generation (a fixed --prompt of token ids, --new tokens, a plain loop of forward calls with the
            KV cache under torch.no_grad, no model.generate) after cpu_offload(model, execution_device="cpu") or
            disk_offload(model, folder, execution_device="cpu"): tokens/s, the bytes of offloaded weights each
            forward reads (the whole model: one forward per new token), and the read rate that implies.

"read" times `cat <offload files> > /dev/null` after the disk-offload run wrote them. Nothing is dropped from the
page cache (the checkpoint and offload files are warm, as they are right after a load): the figures compare the
memory-mapped read path against the kernel's own sequential read of the same bytes, not the disk hardware.
Medians of --repeat runs (generation: --repeat timed loops after a warm-up, in one subprocess per row).

Targets (issue 24): hpc's load time and peak memory at most Accelerate's; disk-offload throughput close to what
reading its files costs (read rate of the disk-offload row near the `cat` rate).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hpc.cli.output import table  # noqa: E402

MB = 1e6


def memory_status() -> dict:
    """VmRSS and VmHWM of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def api(impl: str):
    if impl == "hpc":
        import hpc.big_modeling as big

        return big
    import accelerate.big_modeling as big

    return big


def device_map(layers: int) -> dict:
    half = layers // 2
    dm = {"transformer.wte": "cpu", "transformer.wpe": "cpu"}
    dm.update({f"transformer.h.{i}": "cpu" if i < half else "disk" for i in range(layers)})
    dm.update({"transformer.ln_f": "disk", "lm_head": "disk"})
    return dm


def greedy(model, prompt: list[int], new: int) -> tuple[list[int], float]:
    import torch

    ids = torch.tensor([prompt])
    out_tokens = []
    start = time.perf_counter()
    with torch.no_grad():
        past = None
        step = ids
        for _ in range(new):
            out = model(input_ids=step, past_key_values=past, use_cache=True)
            past = out.past_key_values
            step = out.logits[:, -1:].argmax(-1)
            out_tokens.append(int(step))
    return out_tokens, time.perf_counter() - start


def worker(args) -> dict:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    big = api(args.impl)
    folder = args.folder
    config = GPT2Config.from_pretrained(folder)
    prompt = [(1000 + 7 * i) % config.vocab_size for i in range(args.prompt)]
    if args.worker == "load":
        before = memory_status()["VmRSS"]
        start = time.perf_counter()
        with big.init_empty_weights():
            model = GPT2LMHeadModel(config)
        model.eval()
        model = big.load_checkpoint_and_dispatch(model, folder, device_map=device_map(config.n_layer),
                                                 offload_folder=args.offload, no_split_module_classes=["GPT2Block"])
        took = time.perf_counter() - start
        peak = memory_status()["VmHWM"]
        tokens, _ = greedy(model, prompt, 2)  # a check that both loaded the same weights
        return {"s": took, "peak": peak, "growth": peak - before, "tokens": tokens}
    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if args.worker == "cpu":
        model = big.cpu_offload(model, execution_device="cpu")
    else:
        model = big.disk_offload(model, args.offload, execution_device="cpu")
    greedy(model, prompt, 2)  # warm-up: threads, allocator, the offload files' pages
    times, tokens = [], None
    for _ in range(args.repeat):
        tokens, took = greedy(model, prompt, args.new)
        times.append(took)
    return {"s": statistics.median(times), "bytes": nbytes, "tokens": tokens}


def run_worker(impl: str, kind: str, folder: Path, offload: Path, args, acc_path: str | None) -> dict:
    env = dict(os.environ)
    if impl == "accelerate":
        env["PYTHONPATH"] = acc_path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, __file__, "--worker", kind, "--impl", impl, "--folder", str(folder), "--offload",
           str(offload), "--prompt", str(args.prompt), "--new", str(args.new), "--repeat", str(args.repeat)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{impl} {kind} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def accelerate_available(path: str | None) -> str | None:
    """The PYTHONPATH entry that makes `import accelerate` work in a subprocess ('' when it already does)."""
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = path
    ok = subprocess.run([sys.executable, "-c", "import accelerate.big_modeling"], env=env,
                        capture_output=True).returncode == 0
    return (path or "") if ok else None


def read_rate(files: list[Path], repeat: int) -> float:
    """Bytes/s of `cat files > /dev/null` (page cache warm), median of repeat runs."""
    nbytes = sum(f.stat().st_size for f in files)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times)


def make_checkpoint(folder: Path, layers: int, width: int, vocab: int) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=width // 64, vocab_size=vocab, n_positions=256,
                        tie_word_embeddings=False)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(folder, max_shard_size="100MB", safe_serialization=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    parser.add_argument("--new", type=int, default=16, help="tokens generated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--accelerate-path", default=None,
                        help="a folder holding accelerate (pip install --target); default: accelerate if importable")
    parser.add_argument("--worker", choices=("load", "cpu", "disk"), help=argparse.SUPPRESS)
    parser.add_argument("--impl", choices=("hpc", "accelerate"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--offload", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    acc_path = accelerate_available(args.accelerate_path)
    impls = ["hpc"] + (["accelerate"] if acc_path is not None else [])
    with tempfile.TemporaryDirectory(prefix="big-model-bench-") as tmp:
        work = Path(tmp)
        folder = work / "checkpoint"
        make_checkpoint(folder, args.layers, args.width, args.vocab)
        shards = sorted(folder.glob("*.safetensors"))
        size = sum(f.stat().st_size for f in shards)
        rows, tokens, cat_rate = [], {}, {}
        for impl in impls:
            loads = []
            for i in range(args.repeat):
                offload = work / f"{impl}-load-offload-{i}"
                loads.append(run_worker(impl, "load", folder, offload, args, acc_path))
            tokens[f"{impl} load"] = loads[0]["tokens"]
            rows.append([impl, "load_checkpoint_and_dispatch", f"{statistics.median(r['s'] for r in loads):.3f}",
                         f"{statistics.median(r['peak'] for r in loads) / MB:.0f}",
                         f"{statistics.median(r['growth'] for r in loads) / MB:.0f}", "", "", ""])
            for kind, name in (("cpu", "cpu_offload generate"), ("disk", "disk_offload generate")):
                offload = work / f"{impl}-{kind}-offload"
                r = run_worker(impl, kind, folder, offload, args, acc_path)
                tokens[f"{impl} {kind}"] = r["tokens"]
                tps = args.new / r["s"]
                read = ""
                if kind == "disk":
                    cat_rate[impl] = read_rate(sorted(offload.glob("*.dat")), args.repeat)
                    read = f"{cat_rate[impl] / 1e9:.2f}"
                rows.append([impl, name, f"{r['s']:.3f}", "", "", f"{tps:.2f}", f"{r['bytes'] / MB:.0f}",
                             f"{r['bytes'] * tps / 1e9:.2f}" + (f" (cat {read})" if read else "")])
        if acc_path is None:
            rows.append(["accelerate", "skipped: not importable (pass --accelerate-path DIR)", "", "", "", "", "",
                         ""])

    print(f"GPT-2 style: {args.layers} layers, width {args.width}, vocab {args.vocab}, untied lm_head; "
          f"{size / MB:.0f} MB fp32 in {len(shards)} safetensors shards; {os.cpu_count()} CPUs")
    print(f"prompt {args.prompt} tokens, {args.new} new; medians of {args.repeat}; page cache warm")
    print(table(["impl", "what", "median s", "peak RSS MB", "RSS growth MB", "tokens/s", "MB read/token",
                 "read GB/s"], rows))
    first = [t[:2] for t in tokens.values()]
    same = all(t == first[0] for t in first)
    print(f"greedy tokens agree across implementations and modes: {'yes' if same else 'NO ' + json.dumps(tokens)}")


if __name__ == "__main__":
    main()
