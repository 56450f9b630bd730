#!/usr/bin/env python3
"""What faults and checkpoints cost a day at scale, on paper: docs/benchmarks.md's model, as arithmetic anyone can
rerun with other figures. Nothing here is measured; every input is a published figure or an assumption, named
below (scripts/bench/tier_bandwidth.py measures this machine's copies).

    python scripts/bench/tier_model.py [--step-s 10] [--interval-min 30] [--fs-gbps 100 500]

Per day, for N GPUs training a model of P parameters with Adam in mixed precision:
  state           S = P x 14 bytes (bf16 weights 2, fp32 master weights 4, Adam's two moments 4 + 4; gradients
                  are not saved), s = S / N a rank (fully sharded: ZeRO-3/FSDP, or tensor x pipeline x data
                  parallel with a sharded optimizer, hold about S / N each)
  faults a day    F = 24 h / MTTF
  today           a synchronous save to the shared filesystem every K minutes: stall S / B_fs each, 1440 / K a
                  day; each fault costs detection + restart + the load (S / B_fs) + the work since the last save
                  (K / 2 on average)
  with the tiers  a snapshot to host memory every step (stall s / B_host, 86400 / step_s a day), copied to a peer
                  node in the background (s / B_net of the link's time; not a stall), drained to the shared
                  filesystem in the background; each fault costs detection + restart + the load from host memory
                  or a peer (s / B_net) + half a step
"""

from __future__ import annotations

import argparse

GB = 1e9
BYTES_PER_PARAM = 14
B_HOST = 50 * GB  # a GPU's copy to host memory: PCIe 5.0 x16 is 64 GB/s a direction (PCI-SIG); ~50 GB/s assumed
B_NET = 50 * GB  # 400 Gb/s a GPU: DGX H100's 8 ConnectX-7 NDR ports (NVIDIA's DGX H100 datasheet), line rate
MTTF_H = {1024: 8.0, 16384: 1.8}  # Meta's 4 million jobs (Kokolis et al., HPCA 2025)
LLAMA3_MTTF_H = 54 * 24 / 419  # Llama 3's 54-day pre-training on 16,384 H100s: 419 unexpected interruptions
# assumptions (say so when you quote them): the time from a fault to its notice, and from there to the new
# processes in their process group
TODAY = {"detect_s": 120.0, "restart_s": 300.0}  # a collective's timeout or heartbeat; a requeue, start, init
TIERS = {"detect_s": 10.0, "restart_s": 60.0}  # a watchdog in seconds; a hot spare, a relaunch in place


def per_day(gpus: int, params: float, mttf_h: float, fs_bps: float, step_s: float, interval_min: float) -> dict:
    state = params * BYTES_PER_PARAM
    rank = state / gpus
    faults = 24 / mttf_h
    save_s = state / fs_bps
    today_ckpt = (1440 / interval_min) * save_s
    today_fault = TODAY["detect_s"] + TODAY["restart_s"] + save_s + interval_min * 60 / 2
    tier_ckpt = (86400 / step_s) * rank / B_HOST
    tier_fault = TIERS["detect_s"] + TIERS["restart_s"] + rank / B_NET + step_s / 2
    return {"state_gb": state / GB, "rank_gb": rank / GB, "faults": faults, "save_s": save_s,
            "today_ckpt_min": today_ckpt / 60, "today_fault_min": faults * today_fault / 60,
            "tier_ckpt_min": tier_ckpt / 60, "tier_fault_min": faults * tier_fault / 60,
            "peer_share": (rank / B_NET) / step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step-s", type=float, default=10.0, help="an optimizer step (assumed)")
    parser.add_argument("--interval-min", type=float, default=30.0, help="today's checkpoint interval K")
    parser.add_argument("--fs-gbps", type=float, nargs=2, default=[100.0, 500.0],
                        help="the shared filesystem's write and read rate the job gets, GB/s, at 1,024 and 16,384")
    args = parser.parse_args()
    cases = [(1024, 70e9, MTTF_H[1024], "8 h"), (16384, 70e9, MTTF_H[16384], "1.8 h"),
             (16384, 70e9, LLAMA3_MTTF_H, f"{LLAMA3_MTTF_H:.1f} h (Llama 3)"),
             (16384, 405e9, MTTF_H[16384], "1.8 h")]
    print("| GPUs | model | state / rank | MTTF | faults a day | today: saves | today: faults | today: lost "
          "| tiers: saves | tiers: faults | tiers: lost |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for gpus, params, mttf, said in cases:
        fs = (args.fs_gbps[0] if gpus <= 1024 else args.fs_gbps[1]) * GB
        d = per_day(gpus, params, mttf, fs, args.step_s, args.interval_min)
        today = d["today_ckpt_min"] + d["today_fault_min"]
        tiers = d["tier_ckpt_min"] + d["tier_fault_min"]
        print(f"| {gpus:,} | {params / 1e9:.0f}B | {d['rank_gb'] * 1000:.0f} MB | {said} | {d['faults']:.1f} | "
              f"{d['today_ckpt_min']:.1f} min | {d['today_fault_min']:.0f} min | {today:.0f} min "
              f"({100 * today / 1440:.1f}%) | {d['tier_ckpt_min']:.1f} min | {d['tier_fault_min']:.1f} min | "
              f"{tiers:.1f} min ({100 * tiers / 1440:.1f}%) |")


if __name__ == "__main__":
    main()
