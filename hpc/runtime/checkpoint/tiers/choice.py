"""Which checkpoint a resume reads: the newest complete, verified one of any tier, agreed on by every rank.

Each rank lists the fast-tier folders its node holds for this job (its own ranks' and the copies of the previous
node's), committed and well formed, of this user and job (the manifest says so, besides the folder's name). The
ranks agree on the newest step every rank can read on its own node; each reads, for that step, its own saved rank's
folder, own or a peer copy, and only at the world size it was saved at: a rank's folder holds what that rank alone
saved (the main process's custom objects, its random streams), so after a reshape (an elastic restart with fewer
nodes) the fast tier is not read and the shared tier, exact at any world size, is. A folder whose files do not match
their checksums is skipped with a line, and the ranks agree again. The fast tier's step wins over the shared tier's
when it is as new or newer (memory reads faster than the shared filesystem); else, or with no common step, the
shared tier.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from hpc.runtime.checkpoint import manifest
from hpc.runtime.checkpoint.tiers.node_store import NodeStore


@dataclass(frozen=True)
class Held:
    step: int
    kind: str  # "own" or "peer"
    saved_rank: int
    path: Path
    world: int


@dataclass(frozen=True)
class Choice:
    step: int
    path: Path  # this rank's folder
    tier: str  # "node" when every rank reads a folder its own node wrote, "peer" when one reads a copy


def held(node: NodeStore, job: str) -> list[Held]:
    """The committed, well-formed fast-tier folders of this job on this node (their files not read yet)."""
    out = []
    for kind, saved_rank, store in node.holdings():
        for entry in store.committed():
            data = entry.manifest
            if manifest.malformed(data, entry.path) or data.get("job") != job or data.get("uid") != node.uid \
                    or data.get("rank") != saved_rank or data.get("format") != "full":
                continue
            out.append(Held(entry.step, kind, saved_rank, entry.path, int(data.get("world_size", 0))))
    return out


def _preference(rank: int):
    return lambda h: (h.saved_rank != rank, h.kind != "own", h.saved_rank)


def choose(node: NodeStore, job: str, rank: int, gather, world: int | None = None) -> Choice | None:
    """``gather(obj) -> list``: every rank's object (all ranks call this together). None: no step every rank holds
    (its own saved rank's folder, saved at this world size)."""
    every = held(node, job)
    mine = [h for h in every if h.saved_rank == rank and (world is None or h.world == world)]
    if rank == 0 and every and not mine and world is not None:
        print(f"hpc: the fast tier's checkpoints were saved at world size {every[0].world}, this run has {world}: "
              "resuming from the shared tier, which is exact at another world size", file=sys.stderr, flush=True)
    refused: set[Path] = set()
    while True:
        steps = {h.step for h in mine if h.path not in refused}
        common = set.intersection(*[set(s) for s in gather(sorted(steps))])
        if not common:
            return None
        step = max(common)
        pick, problem = None, None
        for h in sorted((h for h in mine if h.step == step and h.path not in refused), key=_preference(rank)):
            problem = manifest.check(h.path, manifest.read(h.path))
            if problem is None:
                pick = h
                break
            refused.add(h.path)
            print(f"hpc: rank {rank}: skipping the fast-tier checkpoint {h.path}: {problem}", file=sys.stderr,
                  flush=True)
        kinds = gather(pick.kind if pick is not None else None)
        if all(k is not None for k in kinds):
            return Choice(step, pick.path, "node" if all(k == "own" for k in kinds) else "peer")
        mine = [h for h in mine if h.step != step]  # some rank has no good folder of this step: an older one
