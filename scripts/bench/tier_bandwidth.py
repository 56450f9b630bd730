#!/usr/bin/env python3
"""What each checkpoint tier's copy costs on this machine, per byte: the numbers docs/benchmarks.md's at-scale
model starts from (its "measured here" column).

    python scripts/bench/tier_bandwidth.py [--sizes-mib 64 256 1024] [--repeat 3] [--shared DIR]

For each size, the best of --repeat runs (the machine is shared: the best is the least disturbed), in GB/s
(10^9 bytes a second):
  memcpy        a tensor copied into a preallocated host buffer (torch's copy_): what a fast save's snapshot
                of state already in host memory costs; a GPU's state would cross PCIe instead (not here: CPU only)
  /dev/shm      the buffer written to a file in /dev/shm, then fsync: the node tier (RAM-backed tmpfs)
  shared        the same into --shared (default: a private folder under /tmp, this machine's local disk; on a
                cluster, point it at the parallel filesystem to measure that)
  gloo          one tensor sent by rank 0 and received by rank 1, two processes over gloo on 127.0.0.1: a stand-in
                for the link a peer copy crosses between nodes (loopback is memory bandwidth, far above a NIC's:
                it bounds the software's cost, not a network's)
Writes go through the page cache and fsync; each file is removed after its run.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GB = 1e9
CHUNK = 64 << 20  # one write() call at most: large writes in pieces, as a checkpoint writer does


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def memcpy_s(src: torch.Tensor, dst: torch.Tensor, repeat: int) -> float:
    return _best(lambda: dst.copy_(src), repeat)


def write_fsync_s(buf: torch.Tensor, folder: str, repeat: int) -> float:
    view = memoryview(buf.numpy()).cast("B")

    def once() -> None:
        fd, path = tempfile.mkstemp(dir=folder, prefix="tier-bw-")
        try:
            for off in range(0, len(view), CHUNK):
                os.write(fd, view[off:off + CHUNK])
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(path)

    return _best(once, repeat)


def _gloo_rank(rank: int, port: int, nbytes: int, repeat: int, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.zeros(nbytes, dtype=torch.uint8)
    times = []
    for _ in range(repeat):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        dist.barrier()  # the receiver holds every byte: then the sender's clock stops
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(min(times))
    dist.destroy_process_group()


def gloo_s(nbytes: int, repeat: int) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, nbytes, repeat, out)) for r in range(2)]
    for p in procs:
        p.start()
    seconds = out.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shared", default=None, help="a folder on the shared filesystem (default: under /tmp)")
    args = parser.parse_args()
    shared = args.shared or tempfile.mkdtemp(prefix="tier-bw-")  # 0700, ours
    shm = tempfile.mkdtemp(prefix="tier-bw-", dir="/dev/shm")
    torch.set_num_threads(1)  # one copy stream, as one rank's snapshot thread; the machine is shared
    rows = []
    try:
        for mib in args.sizes_mib:
            nbytes = mib << 20
            src = torch.ones(nbytes, dtype=torch.uint8)
            dst = torch.empty_like(src)
            dst.copy_(src)  # touch every page once: a preallocated buffer, not first-touch faults
            cells = [nbytes / memcpy_s(src, dst, args.repeat), nbytes / write_fsync_s(dst, shm, args.repeat),
                     nbytes / write_fsync_s(dst, shared, args.repeat)]
            del src
            cells.append(nbytes / gloo_s(nbytes, args.repeat))
            rows.append((mib, cells))
            del dst
    finally:
        os.rmdir(shm)
        if args.shared is None:
            os.rmdir(shared)
    print(f"| size | memcpy to host | write+fsync /dev/shm | write+fsync {args.shared or '/tmp (local disk)'} | "
          "gloo send/recv, loopback |")
    print("|---|---|---|---|---|")
    for mib, cells in rows:
        print(f"| {mib} MiB | " + " | ".join(f"{c / GB:.2f} GB/s" for c in cells) + " |")


if __name__ == "__main__":
    main()
