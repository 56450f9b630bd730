"""One node's vetting, run by the batch script as one task per node before the ranks start:

    python -m hpc.runtime.vetting.probe REPORT_DIR

writes REPORT_DIR/<node>.json twice: after the node's own checks (so a node that hangs in the network test is
still judged on them), and again with its compute speed, the bandwidth of its links and of one all-reduce over
all nodes. The rendezvous is the job's first host on the port after the job's own (HPC_VET_PORT).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from hpc.contract import runtime_config
from hpc.contract.atomic import atomic_write
from hpc.runtime.vetting import node_checks

_CPU_BYTES = 4 << 20  # gloo moves buffers through host memory: a few MB tell a slow node apart
_GPU_BYTES = 256 << 20


def own_checks(config) -> list[node_checks.Check]:
    vetting = config.vetting
    checks = node_checks.health_check_lines(config.health_check, timeout_s=max(5.0, vetting.timeout / 3))
    checks.append(node_checks.free_memory(vetting.min_free_memory))
    checks += node_checks.free_disk([os.environ.get("HPC_JOB_DIR", ""), tempfile.gettempdir()],
                                    vetting.min_free_disk)
    expected = node_checks.expected_gpus()
    if expected:
        checks.append(node_checks.gpu_count(expected))
        checks += node_checks.nvidia_smi()
        xid = node_checks.xid_errors()
        if xid is not None:
            checks.append(xid)
    return checks


def measure(report: dict, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    from hpc.runtime.vetting import network

    cuda = node_checks.expected_gpus() > 0 and torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    started = time.monotonic()
    report["compute_gflops"] = round(network.compute_gflops(device), 2)
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    report["rank"] = rank
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                            f"{os.environ['HPC_VET_PORT']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        nbytes = _GPU_BYTES if cuda else _CPU_BYTES
        links = network.link_bandwidths(device, nbytes)
        report["links_gbps"] = {peer: round(v, 3) for peer, v in links.items()}
        report["allreduce_gbps"] = round(network.allreduce_gbps(device, nbytes), 3)
    finally:
        dist.destroy_process_group()
    report["seconds"]["network"] = round(time.monotonic() - started, 2)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m hpc.runtime.vetting.probe REPORT_DIR", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    config = runtime_config.current_config() or runtime_config.RuntimeConfig()
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    path = folder / f"{host}.json"
    started = time.monotonic()
    checks = own_checks(config)
    report = {"host": host, "checks": [c.as_dict() for c in checks], "ok": all(c.ok for c in checks),
              "seconds": {"checks": round(time.monotonic() - started, 2)}}
    atomic_write(path, json.dumps(report) + "\n")
    try:
        measure(report, timeout_s=config.vetting.timeout)
    except Exception as e:  # noqa: BLE001 - a node that cannot measure is judged by what it reports
        report["network_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    atomic_write(path, json.dumps(report) + "\n")
    bad = [c for c in checks if not c.ok]
    for c in bad:
        print(f"hpc: vetting {host}: {c.name} failed: {c.detail}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
