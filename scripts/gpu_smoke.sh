#!/usr/bin/env bash
# The CUDA/NCCL paths CI cannot reach (no GPU there), on one GPU: run from the repository root on a GPU machine
# with torch installed. Prints PASS/FAIL lines and the checkpoint benchmark with the state on the GPU, then (issue 35)
# the big-model load's GPU peak beside Accelerate's and the GPT-2 124M training step (hpc, raw torch, Accelerate).
# Accelerate is measured when importable, or from ACC_PATH (a `pip install --target` folder); fp8 (issue 32) needs
# torchao, importable or from AO_PATH (the same kind of folder). About 10 minutes.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
py=${PYTHON:-python3}
work=$(mktemp -d)
$py -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
acc=${ACC_PATH:+--accelerate-path $ACC_PATH}

# 1. AMP and strategies on CUDA (one process: NCCL for FSDP): losses finite and falling
specs='[{"strategy":"ddp","mixed_precision":"fp16","steps":30},{"strategy":"ddp","mixed_precision":"bf16","steps":30},
        {"strategy":"fsdp","mixed_precision":"bf16","steps":30},{"strategy":"fsdp","mixed_precision":"fp16","steps":30}]'
$py -m hpc launch --nproc 1 tests/strategy_worker.py "$specs" "$work/amp.json" 2>&1 | grep -v Warning | tail -3
$py - "$work/amp.json" <<'PY'
import json, math, sys
for r in json.load(open(sys.argv[1])):
    s, l = r["spec"], r["losses"]
    ok = all(math.isfinite(x) for x in l) and sum(l[-5:]) < sum(l[:5])
    print("PASS" if ok else "FAIL", s["strategy"], s["mixed_precision"], r["distributed_type"],
          f"loss {l[0]:.4f} -> {l[-1]:.4f}")
PY

# 2. crash and resume on CUDA (RNG of the GPU included): bitwise equal to the straight run
for s in ddp fsdp; do
  for mode in false true; do
    a="$work/a-$s-$mode" b="$work/b-$s-$mode"
    base="\"strategy\":\"$s\",\"steps\":30,\"save_every\":4,\"async\":$mode"
    $py -m hpc launch --nproc 1 tests/resume_worker.py "{$base,\"project\":\"$a\",\"out\":\"$a.pt\"}" >/dev/null 2>&1
    $py -m hpc launch --nproc 1 tests/resume_worker.py "{$base,\"project\":\"$b\",\"out\":\"$b.pt\",\"crash_at\":13}" >/dev/null 2>&1
    HPC_RESTART_COUNT=1 $py -m hpc launch --nproc 1 tests/resume_worker.py \
      "{$base,\"project\":\"$b\",\"out\":\"$b.pt\",\"crash_at\":13}" 2>&1 | grep "resumed from" | sed 's/.*checkpoints/  resumed from/'
    $py - "$a.pt" "$b.pt" "$s async=$mode" <<'PY'
import sys, torch
a, b = torch.load(sys.argv[1], weights_only=False), torch.load(sys.argv[2], weights_only=False)
same = a["losses"] == b["losses"] and all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
dev = {t.device.type for t in a["weights"].values()}
print("PASS" if same else "FAIL", "bitwise resume on cuda:", sys.argv[3], "(weights gathered to", dev, ")")
PY
  done
done

# 3. checkpoint cost with the training state in GPU memory
$py scripts/bench/checkpoint.py --device cuda --gib "${GIB:-1}" --repeat 9 --crash-trials 0 2>&1 | grep -v -i warn

# 4. big-model load: GPU memory over load_checkpoint_and_dispatch + 3 forwards, hpc beside Accelerate (355M GPT-2)
timeout 180 $py scripts/bench/big_model_gpu_peak.py --rounds 2 $acc 2>&1 | grep -v -i "warn\|Writing"

# 5. training step of GPT-2 124M, bf16, DDP and FSDP2 on one GPU: hpc beside raw torch and Accelerate, alternated
timeout 300 $py scripts/bench/gpu_step.py --rounds 2 --steps 30 $acc 2>&1 | grep -v -i warn
# 6. fp8 against bf16 (torchao Float8Linear, FSDP2's fp8 all-gather): loss over 200 steps, step time, peak memory
PYTHONPATH="${AO_PATH:+$AO_PATH:}$PYTHONPATH" timeout 240 $py scripts/bench/fp8_step.py --steps 200 2>&1 | grep -v -i warn
rm -rf "$work"
