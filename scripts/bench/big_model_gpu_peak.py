#!/usr/bin/env python3
"""Peak GPU memory of load_checkpoint_and_dispatch and three forward passes: hpc beside Accelerate (issue 35).

    python scripts/bench/big_model_gpu_peak.py [--layers 24] [--width 1024] [--rounds 2] [--accelerate-path DIR]

A GPT-2 355M (24 layers, width 1024, tied head) from its config, saved once with save_pretrained (safetensors), is
built under each library's init_empty_weights (then tie_weights, which Accelerate's needs under transformers 5),
loaded with device_map="auto" (whole on GPU 0) and with a GPU+CPU map (max_memory: GPU 0 gets half the model),
then runs three forward passes (batch 4 x 512, no_grad). Each row is a fresh process, the libraries alternated:
GPU memory allocated after the load, the peak over the load, the peak over load and forwards.

Without a GPU it measures the host side instead, with the device stood in for by meta (hpc.runtime.test_support.
live_storage): the bytes the load put on the device at its peak, and the host's peak, exactly, in storage bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _big(impl: str):
    import hpc.big_modeling as hpc_big

    if impl == "hpc":
        return hpc_big
    import accelerate.big_modeling as acc_big

    return acc_big


def worker(impl: str, folder: str, mode: str) -> dict:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    big = _big(impl)
    config = GPT2Config.from_pretrained(folder)
    with big.init_empty_weights():
        model = GPT2LMHeadModel(config)
    model.tie_weights()
    model.eval()
    size = sum(t.numel() * t.element_size() for t in {id(p): p for p in model.parameters()}.values())
    if not torch.cuda.is_available():
        from hpc.runtime.test_support.live_storage import LiveStorage

        device = LiveStorage("meta", ignore=[*model.parameters(), *model.buffers()])
        with device, LiveStorage("cpu", inputs=True) as host:
            if impl == "hpc":
                from hpc.utils import load_checkpoint_in_model
            else:
                from accelerate.utils import load_checkpoint_in_model
            load_checkpoint_in_model(model, folder, device_map={"": "meta"})
        return {"size": size, "device_peak": device.peak, "host_peak": host.peak}
    max_memory = None if mode == "auto" else {0: size // 2, "cpu": 64 * 2**30}
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = big.load_checkpoint_and_dispatch(model, folder, device_map="auto", max_memory=max_memory,
                                             no_split_module_classes=["GPT2Block"])
    after = torch.cuda.memory_allocated() - base
    load_peak = torch.cuda.max_memory_allocated() - base
    ids = torch.randint(0, config.vocab_size, (4, 512), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        for _ in range(3):
            logits = model(input_ids=ids).logits
            del logits
    return {"size": size, "after_load": after, "load_peak": load_peak,
            "peak": torch.cuda.max_memory_allocated() - base,
            "map": sorted({str(v) for v in model.hf_device_map.values()})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--accelerate-path", default=None)
    parser.add_argument("--worker", choices=("hpc", "accelerate"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("auto", "gpu+cpu"), default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.folder, args.mode)))
        return
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from hpc.cli.output import table

    gpu = torch.cuda.is_available()
    env = dict(os.environ)
    if args.accelerate_path:
        env["PYTHONPATH"] = args.accelerate_path + os.pathsep + env.get("PYTHONPATH", "")
    has_acc = subprocess.run([sys.executable, "-c", "import accelerate"], env=env, capture_output=True).returncode == 0
    impls = ["hpc"] + (["accelerate"] if has_acc else [])
    GiB = 2**30
    rows = []
    with tempfile.TemporaryDirectory(prefix="big-model-peak-") as tmp:
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.width // 64)) \
            .save_pretrained(tmp, safe_serialization=True)
        for mode in ("auto", "gpu+cpu") if gpu else ("auto",):
            for r in range(args.rounds):
                for impl in impls if r % 2 == 0 else impls[::-1]:
                    proc = subprocess.run([sys.executable, __file__, "--worker", impl, "--folder", tmp, "--mode",
                                           mode], env=env, capture_output=True, text=True, timeout=600)
                    if proc.returncode != 0:
                        why = "failed: " + proc.stderr.strip().splitlines()[-1][:100]
                        rows.append([mode, impl, str(r), why])
                        continue
                    out = json.loads(proc.stdout.strip().splitlines()[-1])
                    if gpu:
                        rows.append([mode, impl, str(r), f"{out['size'] / GiB:.2f}", f"{out['after_load'] / GiB:.2f}",
                                     f"{out['load_peak'] / GiB:.2f}", f"{out['peak'] / GiB:.2f}", ",".join(out["map"])])
                    else:
                        rows.append([mode, impl, str(r), f"{out['size'] / GiB:.3f}", f"{out['device_peak'] / GiB:.3f}",
                                     f"{out['host_peak'] / GiB:.3f}"])
    where = torch.cuda.get_device_name(0) if gpu else f"no GPU: host side, device stood in for by meta; " \
                                                      f"{os.cpu_count()} CPUs"
    print(f"GPT-2 {args.layers} layers, width {args.width}, tied head; {where}; torch {torch.__version__}")
    head = ["map", "impl", "round", "model GiB"]
    head += ["after load GiB", "load peak GiB", "peak GiB (3 fwd)", "devices"] if gpu else \
        ["device peak GiB", "host peak GiB"]
    print(table(head, [row + [""] * (len(head) - len(row)) for row in rows]))


if __name__ == "__main__":
    main()
