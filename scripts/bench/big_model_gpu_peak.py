#!/usr/bin/env python3
"""Peak GPU memory of load_checkpoint_and_dispatch and three forward passes: hpc beside Accelerate (issue 35).

    python scripts/bench/big_model_gpu_peak.py [--layers 24] [--width 1024] [--batch 4] [--seq 512] [--rounds 2]
                                               [--accelerate-path DIR]

A GPT-2 355M (24 layers, width 1024, tied head) from its config, saved once with save_pretrained (safetensors), is
built under each library's init_empty_weights (then tie_weights, which Accelerate's needs under transformers 5),
loaded with device_map="auto" (whole on GPU 0) and with a GPU+CPU map (max_memory: GPU 0 gets half the model),
then runs three forward passes (batch 4 x 512, no_grad). Each row is a fresh process, the libraries alternated:
GPU memory allocated after the load, the peak over the load, the peak over load and forwards.

The second table says where a difference lies, phase by phase: the bytes of the model's own tensors on the GPU
after the load (beside what is allocated: more allocated than that is held by something else), each forward's
peak, and a fourth forward counted twice, by the allocator and in live tensor storage bytes
(hpc.runtime.test_support.live_storage, which sees every tensor an op makes or reads): equal storage peaks with
unequal allocator peaks put the difference in the caching allocator (rounding, fragmentation from the load's
allocation order), unequal storage peaks in the code. "floor" is what a forward must hold at the head whatever runs
it: the model, its KV cache (use_cache), the logits and one hidden state. "allocator trace" is the count and a hash
of the caching allocator's events (action, bytes) over the load and the three forwards: equal in two rows, the
allocator was asked for the same blocks in the same order, and equal requests give equal peaks. With them: the
attention implementation, use_cache, the hooks on the model, the SDPA backends and TF32 as each process had them.

Without a GPU, the same sequence runs on the CPU (device "cpu", both libraries, fresh processes), counted in live
storage bytes: bytes held after the load, the load's peak and the forwards' peak beside the floor; and the load's
host side with the device stood in for by meta (hpc only: Accelerate cannot load onto meta): the bytes the load put
on the device at its peak, and the host's peak.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
GiB = 2**30


def _big(impl: str):
    import hpc.big_modeling as hpc_big

    if impl == "hpc":
        return hpc_big
    import accelerate.big_modeling as acc_big

    return acc_big


def _floor(config, size: int, itemsize: int, batch: int, seq: int) -> int:
    """The storage bytes a forward holds at the head at the least: the model, the KV cache of every layer (when
    use_cache), the logits, one hidden state and the input ids."""
    tokens = batch * seq
    cache = config.n_layer * 2 * tokens * config.n_embd * itemsize if config.use_cache else 0
    return size + cache + tokens * config.vocab_size * itemsize + tokens * config.n_embd * itemsize + tokens * 8


def _describe(model) -> dict:
    """What decides the forward's memory besides the weights: attention, cache, hooks, and where the tensors are
    (bytes of unique storages by device type: a tensor held twice shows as more than the model's size)."""
    import torch

    storages: dict = {}
    for t in [*model.parameters(), *model.buffers()]:
        storages[(t.device.type, t.untyped_storage().data_ptr())] = t.untyped_storage().nbytes()
    by_type: dict = {}
    for (kind, _), nbytes in storages.items():
        by_type[kind] = by_type.get(kind, 0) + nbytes
    info = {"attn": model.config._attn_implementation, "use_cache": bool(model.config.use_cache),
            "hooks": sum(1 for m in model.modules() if hasattr(m, "_hf_hook")),
            "dtypes": sorted({str(t.dtype).replace("torch.", "") for t in model.parameters()}),
            "tensor_bytes": by_type,
            "tied": model.lm_head.weight is model.transformer.wte.weight}
    if torch.cuda.is_available():
        b = torch.backends.cuda
        info["sdpa"] = "".join(flag if on else "-" for flag, on in (
            ("F", b.flash_sdp_enabled()), ("E", b.mem_efficient_sdp_enabled()), ("M", b.math_sdp_enabled())))
        info["tf32"] = bool(b.matmul.allow_tf32)
    return info


def _cpu_worker(big, model, folder: str, config, ids) -> dict:
    """The GPU sequence with "cpu" as the device, in live storage bytes (the allocator left out)."""
    import torch

    from hpc.runtime.test_support.live_storage import LiveStorage

    with LiveStorage("cpu") as load:
        model = big.load_checkpoint_and_dispatch(model, folder, device_map="auto",
                                                 no_split_module_classes=["GPT2Block"])
    gc.collect()
    out = {"after_load": load.measure(), "load_peak": load.peak, "map": sorted({str(v) for v in
                                                                                 model.hf_device_map.values()})}
    peaks = []
    with torch.no_grad():
        for _ in range(3):
            with LiveStorage("cpu", inputs=True) as fwd:
                for t in [*model.parameters(), *model.buffers(), ids]:
                    fwd.note(t)
                logits = model(input_ids=ids).logits
                del logits
            peaks.append(fwd.peak)
    return {**out, "fwd_peaks": peaks, **_describe(model)}


def _trace_start() -> bool:
    """Record the caching allocator's events (no stacks: cheap) from here on; False where this torch cannot."""
    import torch

    try:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=10**7)
        return True
    except Exception:  # an older or newer torch without this private API: the rest of the row stands
        return False


def _trace_digest() -> str | None:
    """The allocator's requests since _trace_start as (action, bytes) in order, as a count and a short hash: equal
    digests in two processes mean the allocator was asked for the same blocks in the same order, so its peaks are
    equal and a difference lies outside these requests."""
    import hashlib

    import torch

    try:
        traces = torch.cuda.memory._snapshot()["device_traces"]
        torch.cuda.memory._record_memory_history(enabled=None)
    except Exception:
        return None
    events = [(e["action"], e["size"]) for e in (traces[0] if traces else []) if e["action"] != "snapshot"]
    return f"{len(events)}:{hashlib.sha1(repr(events).encode()).hexdigest()[:10]}"


def _gpu_worker(big, model, folder: str, mode: str, size: int, ids) -> dict:
    import torch

    from hpc.runtime.test_support.live_storage import LiveStorage

    def stat(key: str):
        return torch.cuda.memory_stats().get(key)

    max_memory = None if mode == "auto" else {0: size // 2, "cpu": 64 * GiB}
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    tracing = _trace_start()
    model = big.load_checkpoint_and_dispatch(model, folder, device_map="auto", max_memory=max_memory,
                                             no_split_module_classes=["GPT2Block"])
    after = torch.cuda.memory_allocated() - base
    load_peak = torch.cuda.max_memory_allocated() - base
    ids = ids.cuda()
    fwd_peaks, fwd_after = [], []
    with torch.no_grad():
        for _ in range(3):
            torch.cuda.reset_peak_memory_stats()
            logits = model(input_ids=ids).logits
            del logits
            fwd_peaks.append(torch.cuda.max_memory_allocated() - base)
            fwd_after.append(torch.cuda.memory_allocated() - base)
        torch.cuda.synchronize()
        trace = _trace_digest() if tracing else None
        # a fourth forward counted twice: by the allocator and in live storage bytes
        torch.cuda.reset_peak_memory_stats()
        with LiveStorage("cuda", inputs=True) as live:
            for t in [*model.parameters(), *model.buffers(), ids]:
                live.note(t)
            logits = model(input_ids=ids).logits
            del logits
        torch.cuda.synchronize()
    return {"after_load": after, "load_peak": load_peak, "peak": max(load_peak, *fwd_peaks),
            "fwd_peaks": fwd_peaks, "fwd_after": fwd_after, "live_peak": live.peak,
            "alloc_peak4": torch.cuda.max_memory_allocated() - base,
            "requested_peak4": stat("requested_bytes.all.peak"), "alloc_retries": stat("num_alloc_retries"),
            "trace": trace,
            "map": sorted({str(v) for v in model.hf_device_map.values()}), **_describe(model)}


def worker(impl: str, folder: str, mode: str, batch: int, seq: int) -> dict:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    big = _big(impl)
    config = GPT2Config.from_pretrained(folder)
    with big.init_empty_weights():
        model = GPT2LMHeadModel(config)
    model.tie_weights()
    model.eval()
    unique = {id(p): p for p in model.parameters()}.values()
    size = sum(t.numel() * t.element_size() for t in unique)
    itemsize = next(iter(unique)).element_size()
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    common = {"size": size, "floor": _floor(config, size, itemsize, batch, seq),
              "versions": f"torch {torch.__version__}, transformers {__import__('transformers').__version__}"}
    if mode == "host":
        from hpc.runtime.test_support.live_storage import LiveStorage

        device = LiveStorage("meta", ignore=[*model.parameters(), *model.buffers()])
        with device, LiveStorage("cpu", inputs=True) as host:
            if impl == "hpc":
                from hpc.utils import load_checkpoint_in_model
            else:
                from accelerate.utils import load_checkpoint_in_model
            load_checkpoint_in_model(model, folder, device_map={"": "meta"})
        return {**common, "device_peak": device.peak, "host_peak": host.peak}
    if mode == "cpu":
        return {**common, **_cpu_worker(big, model, folder, config, ids)}
    return {**common, **_gpu_worker(big, model, folder, mode, size, ids)}


def _gib(value) -> str:
    return "" if value is None else f"{value / GiB:.3f}"


def _diag(out: dict) -> list[str]:
    tensor_bytes = ",".join(f"{k}:{v / GiB:.3f}" for k, v in sorted(out["tensor_bytes"].items()))
    flags = f"{out['attn']} cache={'on' if out['use_cache'] else 'off'} hooks={out['hooks']}"
    if "sdpa" in out:
        flags += f" sdpa={out['sdpa']} tf32={'on' if out['tf32'] else 'off'}"
    return [tensor_bytes, flags]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--accelerate-path", default=None)
    parser.add_argument("--worker", choices=("hpc", "accelerate"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("auto", "gpu+cpu", "cpu", "host"), default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.folder, args.mode, args.batch, args.seq)))
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
    main_rows, diag_rows, host_rows = [], [], []
    versions = ""
    with tempfile.TemporaryDirectory(prefix="big-model-peak-") as tmp:
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.width // 64)) \
            .save_pretrained(tmp, safe_serialization=True)
        runs = [(mode, r, impl) for mode in (("auto", "gpu+cpu") if gpu else ("cpu",)) for r in range(args.rounds)
                for impl in (impls if r % 2 == 0 else impls[::-1])]
        runs += [] if gpu else [("host", 0, "hpc")]
        for mode, r, impl in runs:
            proc = subprocess.run([sys.executable, __file__, "--worker", impl, "--folder", tmp, "--mode", mode,
                                   "--batch", str(args.batch), "--seq", str(args.seq)],
                                  env=env, capture_output=True, text=True, timeout=900)
            rows = host_rows if mode == "host" else main_rows
            if proc.returncode != 0:
                lines = proc.stderr.strip().splitlines() or ["(no output)"]
                rows.append([mode, impl, str(r), "failed: " + lines[-1][:100]])
                continue
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            versions = out["versions"]
            key = [mode, impl, str(r)]
            if mode == "host":
                host_rows.append(key + [_gib(out["size"]), _gib(out["device_peak"]), _gib(out["host_peak"])])
            elif mode == "cpu":
                main_rows.append(key + [_gib(out["size"]), _gib(out["after_load"]), _gib(out["load_peak"]),
                                        "/".join(_gib(p) for p in out["fwd_peaks"]), _gib(out["floor"]),
                                        str(max(out["fwd_peaks"]) - out["floor"]), ",".join(out["map"])])
                diag_rows.append(key + _diag(out))
            else:
                main_rows.append(key + [_gib(out["size"]), _gib(out["after_load"]), _gib(out["load_peak"]),
                                        _gib(out["peak"]), ",".join(out["map"])])
                diag_rows.append(key + [_gib(out["tensor_bytes"].get("cuda", 0)),
                                        "/".join(_gib(p) for p in out["fwd_peaks"]),
                                        "/".join(_gib(p) for p in out["fwd_after"]),
                                        _gib(out["alloc_peak4"]), _gib(out["requested_peak4"]), _gib(out["live_peak"]),
                                        _gib(out["floor"]) if mode == "auto" else "",
                                        str(out["live_peak"] - out["floor"]) if mode == "auto" else "",
                                        str(out["alloc_retries"]), str(out["trace"]),
                                        _diag(out)[1]])
    where = torch.cuda.get_device_name(0) if gpu else f"no GPU: the same sequence on the CPU, in live storage " \
                                                      f"bytes; {os.cpu_count()} CPUs"
    print(f"GPT-2 {args.layers} layers, width {args.width}, tied head, {args.batch} x {args.seq} tokens; {where}; "
          f"{versions or 'torch ' + torch.__version__}")

    def show(head: list[str], rows: list) -> None:
        print(table(head, [row + [""] * (len(head) - len(row)) for row in rows]))

    base = ["map", "impl", "round"]
    if gpu:
        show(base + ["model GiB", "after load GiB", "load peak GiB", "peak GiB (3 fwd)", "devices"], main_rows)
        print("\nby phase (GiB above the start; fwd 4 counted by the allocator, its requests, and in live storage):")
        show(base + ["model on GPU", "fwd peaks", "after each fwd", "fwd 4 alloc", "fwd 4 requested",
                     "fwd 4 storage", "floor", "storage - floor B", "alloc retries",
                     "allocator trace", "attention, cache, hooks"],
             diag_rows)
    else:
        show(base + ["model GiB", "after load GiB", "load peak GiB", "fwd peaks GiB", "floor GiB", "peak - floor B",
                   "devices"],
             main_rows)
        print()
        show(base + ["tensors by device GiB", "attention, cache, hooks"], diag_rows)
        print("\nthe load's host side, the device stood in for by meta (Accelerate cannot load onto meta):")
        show(base + ["model GiB", "device peak GiB", "host peak GiB"], host_rows)


if __name__ == "__main__":
    main()
