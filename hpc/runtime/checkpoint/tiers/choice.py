"""Which checkpoint a resume reads: the newest complete, verified one of any tier, agreed on by every rank.

Each rank lists the fast-tier folders its node holds for this job (its own ranks' and the copies of the previous
node's), committed and well formed, of this user and job (the manifest says so, besides the folder's name), saved
at this run's world size: a rank's folder holds what that rank alone saved (the main process's custom objects, its
random streams), so after a reshape (an elastic restart with fewer nodes) the fast tier is not read and the shared
tier, exact at any world size, is. The ranks share these lists and take the newest step for which every saved
rank's folder is held somewhere: each rank reads its own saved rank's folder from its node (own, else a peer copy),
and a rank whose node holds none (a hot spare in a lost node's place, a node that came back empty) is sent it by a
rank whose node holds it (``fetch``: checked against its checksums as it arrives, committed as a peer copy). A
folder whose files do not match their checksums is skipped with a line, and the ranks agree again. The fast tier's
step wins over the shared tier's when it is as new or newer (memory reads faster than the shared filesystem);
else, or with no common step, the shared tier.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from hpc.runtime.checkpoint import manifest
from hpc.runtime.checkpoint.tiers.node_store import NodeStore


@dataclass(frozen=True)
class Held:
    step: int
    kind: str  # "own", "peer" (a copy the previous node sent as it saved), "fetched" (sent at this resume)
    saved_rank: int
    path: Path
    world: int
    whole_in: int  # the saved rank whose folder holds the replicated state (this one's for a "full" folder)


@dataclass(frozen=True)
class Choice:
    step: int
    path: Path  # the folder holding the replicated state: this rank's, or its node's first rank's
    tier: str  # "node" when every rank reads folders its own node wrote, "peer" when one reads a copy
    part: Path | None = None  # this rank's own folder (its random streams, its readers), where not ``path``


FORMATS = manifest.FAST_TIER_FORMATS  # a folder with the replicated state, or a rank's own streams and readers only


def held(node: NodeStore, job: str) -> list[Held]:
    """The committed, well-formed fast-tier folders of this job on this node (their files not read yet)."""
    out = []
    for kind, saved_rank, store in node.holdings():
        for entry in store.committed():
            found = _ours(entry.manifest, entry.path, kind, saved_rank, entry.step, job, node.uid)
            if found is not None:
                out.append(found)
    return out


def _ours(data: dict, path: Path, kind: str, saved_rank: int, step: int, job: str, uid: int) -> Held | None:
    """``path``'s manifest as a Held: well formed, this job's, this user's, the saved rank's (a part naming another
    rank's folder for the replicated state); else None."""
    if manifest.malformed(data, path, FORMATS) or data.get("job") != job or data.get("uid") != uid \
            or data.get("rank") != saved_rank:
        return None
    part = data["format"] == manifest.PART
    whole_in = data.get("whole_in") if part else saved_rank
    if not isinstance(whole_in, int) or isinstance(whole_in, bool) or (part and whole_in == saved_rank):
        return None
    return Held(step, kind, saved_rank, path, int(data.get("world_size", 0)), whole_in)


def _preference(rank: int):
    return lambda h: (h.saved_rank != rank, h.kind != "own", h.saved_rank)


def plan(offers: list[list[tuple[int, int]]]) -> tuple[int | None, list[tuple[int, int, int]]]:
    """``offers[r]``: the (saved rank, step) folders rank r's node holds. The newest step whose every saved rank
    (one per rank of the run) is held by some rank, and the transfers it takes: (holder, needer, saved rank) for
    each rank whose own node lacks its folder, sent by the lowest rank that holds it. (None, []) if there is none."""
    world = len(offers)
    held_by = [set(map(tuple, o)) for o in offers]
    for step in sorted({s for o in held_by for _, s in o}, reverse=True):
        moves = []
        for needer in range(world):
            if (needer, step) in held_by[needer]:
                continue
            holders = [h for h in range(world) if (needer, step) in held_by[h]]
            if not holders:
                break
            moves.append((holders[0], needer, needer))
        else:
            return step, moves
    return None, []


def choose(node: NodeStore, job: str, rank: int, gather, world: int | None = None, fetch=None) -> Choice | None:
    """``gather(obj) -> list``: every rank's object (all ranks call this together). ``fetch(step, moves, folder_of)
    -> Path | None``: the transfers of ``plan`` (every rank calls it with the same moves; ``folder_of(saved_rank)``:
    this rank's checked folder of it to send, or None), returning the folder this rank received, if it needed one.
    None: no step whose every saved rank's folder (saved at this world size) some rank holds."""
    every = held(node, job)
    usable = [h for h in every if world is None or h.world == world]
    if rank == 0 and every and not usable:
        print(f"hpc: the fast tier's checkpoints were saved at world size {every[0].world}, this run has {world}: "
              "resuming from the shared tier, which is exact at another world size", file=sys.stderr, flush=True)
    refused: set[Path] = set()
    while True:
        offers = sorted({(h.saved_rank, h.step) for h in usable if h.path not in refused})
        everyone = gather(offers)
        if fetch is None:  # each rank its own saved rank's folder, from its own node only
            everyone = [[o for o in theirs if o[0] == r] for r, theirs in enumerate(everyone)]
        step, moves = plan(everyone)
        if step is None:
            return None
        pick = _checked(usable, refused, rank, rank, step)
        if moves:
            received = fetch(step, moves, lambda saved: _checked(usable, refused, saved, rank, step))
            if any(needer == rank for _, needer, _ in moves):
                pick = _received(received, step, rank, job, node.uid)
        picks = gather((pick.kind, str(pick.path), socket.gethostname()) if pick is not None else None)
        if all(p is not None for p in picks):
            # every rank has its own folder on its node now: a part's replicated state is its node's first rank's
            whole = pick if pick.whole_in == pick.saved_rank else _whole(node, job, world, refused, pick, rank, picks)
            kind = None if whole is None else "own" if pick.kind == whole.kind == "own" else "peer"
            kinds = gather(kind)
            if all(k is not None for k in kinds):
                return Choice(step, whole.path, "node" if all(k == "own" for k in kinds) else "peer",
                              part=pick.path if whole is not pick else None)
        usable = [h for h in usable if h.step != step]  # some rank has no good folder of this step: an older one


def _whole(node: NodeStore, job: str, world: int | None, refused: set[Path], pick: Held, rank: int,
           picks: list) -> Held | None:
    """The folder with the replicated state that ``pick`` (a part) goes with, on this node. Where the rank that
    saved it runs on this node now, the very folder it checked (or was sent) is taken, not read again (a node of 8
    ranks would check the whole state 8 times); else this node's copy of it, checked here."""
    w = pick.whole_in
    if 0 <= w < len(picks) and picks[w][2] == socket.gethostname():
        return Held(pick.step, picks[w][0], w, Path(picks[w][1]), pick.world, w)
    found = [h for h in held(node, job) if (world is None or h.world == world) and h.path not in refused]
    return _checked(found, refused, w, rank, pick.step)


def _checked(usable: list[Held], refused: set[Path], saved_rank: int, rank: int, step: int) -> Held | None:
    """This node's folder of ``saved_rank`` at ``step`` whose files match their checksums (own before a peer copy),
    or None; a damaged one is refused with a line."""
    for h in sorted((h for h in usable if h.step == step and h.saved_rank == saved_rank and h.path not in refused),
                    key=_preference(rank)):
        problem = manifest.check(h.path, manifest.read(h.path), FORMATS)
        if problem is None:
            return h
        refused.add(h.path)
        print(f"hpc: rank {rank}: skipping the fast-tier checkpoint {h.path}: {problem}", file=sys.stderr, flush=True)
    return None


def _received(folder: Path | None, step: int, rank: int, job: str, uid: int) -> Held | None:
    """The folder another rank sent, committed here under its manifest (checksums checked on arrival): this
    job's, this user's, this rank's, of the step agreed on."""
    data = manifest.read(folder) if folder is not None else None
    got = _ours(data, folder, "fetched", rank, step, job, uid) if data is not None and data.get("step") == step \
        else None
    if got is None:
        if folder is not None:
            print(f"hpc: rank {rank}: the fast-tier checkpoint sent to {folder} is not this rank's of step {step}",
                  file=sys.stderr, flush=True)
        return None
    return got
