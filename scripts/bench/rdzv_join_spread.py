#!/usr/bin/env python3
"""How long N torchrun agents that reach a c10d rendezvous at once take to all join its round: what the round's
last call (hpc's rendezvous.last_call_timeout) must cover, or the nodes that join later miss the round.

    python scripts/bench/rdzv_join_spread.py 2 8 32 64

Each of N handlers (torch's own DynamicRendezvousHandler, hpc's keep-alive of 1 s x 3) has a TCPStore client of its
own and joins from a thread of this one process, all released at once; the round has min 1 and max N nodes and a
60 s last call, so it completes when the N-th joins. Printed: seconds from the release to the last node's return.
The node-loss case is the same: a new round opens only once every survivor has left the old one, so they all wait
for it and join together. Threads of one process share one interpreter (and here 2 busy cores): slower than N
machines, so an upper bound.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(n: int) -> str:
    port = _free_port()
    handlers = []
    for i in range(n):
        params = RendezvousParameters("c10d", f"127.0.0.1:{port}", f"spread{n}", 1, n, is_host=str(int(i == 0)),
                                      join_timeout=120, last_call_timeout=60, keep_alive_interval=1,
                                      keep_alive_max_attempt=3)
        backend, store = create_backend(params)
        handlers.append(create_handler(store, backend, params))
    released: list[float] = []
    go = threading.Barrier(n, action=lambda: released.append(time.monotonic()))
    done: list[tuple[float, int] | None] = [None] * n

    def join(i: int) -> None:
        go.wait()
        try:
            world = handlers[i].next_rendezvous().world_size
            done[i] = (time.monotonic(), world)
        except Exception:  # a timeout: this node never joined
            pass

    threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for h in handlers:
        h._stop_heartbeats()
    joined = [d for d in done if d is not None]
    if len(joined) < n or {w for _, w in joined} != {n}:
        return f"N={n}: {len(joined)} of {n} joined a round of world {sorted({w for _, w in joined})}"
    return f"N={n}: all in one round after {max(t for t, _ in joined) - released[0]:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("nodes", type=int, nargs="+")
    for n in parser.parse_args().nodes:
        print(one_round(n), flush=True)


if __name__ == "__main__":
    main()
