"""What a node's links and compute do, measured among the job's nodes (one process per node).

Links: up to three rounds of disjoint pairs (a round-robin tournament's first rounds), each pair exchanging a
buffer both ways while the other pairs do the same. A slow node's every link is slow, while a healthy node meets
at least one healthy partner: a node's best link names the culprit (with three nodes or more; two nodes share
their only link). Then one all-reduce over all. Compute: a fixed matrix product, timed. Each number is the best
of a few runs.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

_RUNS = 3


def _best_seconds(fn, device: torch.device) -> float:
    fn()  # warm-up: connections, kernels, allocations
    best = float("inf")
    for _ in range(_RUNS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def compute_gflops(device: torch.device) -> float:
    n = 4096 if device.type == "cuda" else 384
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    repeats = 8

    def work():
        for _ in range(repeats):
            torch.mm(a, b)

    return 2 * n**3 * repeats / _best_seconds(work, device) / 1e9


def pairings(world: int, rounds: int = 3) -> list[dict[int, int]]:
    """Up to ``rounds`` rounds of disjoint pairs, every node meeting a new partner each round (the circle method;
    with an odd count one node sits each round out)."""
    players: list[int | None] = [*range(world), *([None] if world % 2 else [])]
    out = []
    for _ in range(min(rounds, len(players) - 1)):
        half = len(players) // 2
        partner = {}
        for a, b in zip(players[:half], reversed(players[half:])):
            if a is not None and b is not None:
                partner[a], partner[b] = b, a
        out.append(partner)
        players = [players[0], players[-1], *players[1:-1]]
    return out


def link_bandwidths(device: torch.device, nbytes: int) -> dict[str, float]:
    """GB/s of this node's link to each partner it met: {"<rank>": ...}."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict[str, float] = {}
    send = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    for partner in pairings(world):
        peer = partner.get(rank)
        if peer is not None:
            def exchange(peer=peer):
                ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
                for req in dist.batch_isend_irecv(ops):
                    req.wait()

            out[str(peer)] = nbytes / _best_seconds(exchange, device) / 1e9
        dist.barrier()  # the next round's pairs start together
    return out


def allreduce_gbps(device: torch.device, nbytes: int) -> float:
    """Bus bandwidth of one all-reduce over every node (NCCL's convention: 2 (n-1)/n of the bytes move)."""
    world = dist.get_world_size()
    buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    seconds = _best_seconds(lambda: dist.all_reduce(buffer), device)
    return nbytes * 2 * (world - 1) / world / seconds / 1e9
