"""Which checkpoint a resume reads: the newest complete, verified one of any tier, agreed on by every rank.

Each rank lists the fast-tier folders its node holds for this job (its own ranks' and the copies of the previous
node's), committed and well formed, of this user and job (the manifest says so, besides the folder's name). A
step's folders were all saved at one world size; a rank's folder holds what that rank alone saved (its random
streams, its readers' positions) and, on a node's first rank, the replicated state (a DDP model is the same on
every rank). The ranks share these lists and take the newest step whose folders every rank of this run needs are
held somewhere: rank r needs saved rank r's folder (none where r is new since the save: it keeps the streams the
script seeded, as at a resume of the shared tier at another world size) and, on its node, a folder with the
replicated state (the one its part names; saved rank 0's for a rank new since the save). A node that lacks one (a
hot spare in a lost node's place, a node that came back empty, a node whose ranks were renumbered by an elastic
restart at another world size) is sent it by the lowest rank holding it (``fetch``: checked against its checksums
as it arrives, committed as a peer copy), once a node. So an elastic job that lost a node resumes from the fast
tier at its new size, exact by the same rules as a resume of the shared tier at another world size. A folder whose
files do not match their checksums is skipped with a line, and the ranks agree again. A sharded model's folders
(each rank's own shards, format "shard") are read at the world size they were saved at only. The fast tier's step wins
over the shared tier's when it is as new or newer (memory reads faster than the shared filesystem); else, or with
no common step, the shared tier.
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
    sharded: bool = False  # a rank's own shards (FSDP): read at the world size and layout it was saved at only
    layout: str | None = None  # a sharded folder's layout (checkpoint/local_shards.py)


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
    return Held(step, kind, saved_rank, path, int(data.get("world_size", 0)), whole_in,
                data["format"] == manifest.SHARD, data.get("layout"))


def _preference(rank: int):
    return lambda h: (h.saved_rank != rank, h.kind != "own", h.saved_rank)


def plan(offers: list[tuple[str, list[tuple[int, int, int, int]]]]) -> tuple[tuple[int, int] | None, list]:
    """``offers[r]``: rank r's node (a name the ranks of one node share) and the (saved rank, step, saved world,
    whole_in) folders it holds. The newest (step, saved world) whose folders every rank needs are held somewhere,
    and the transfers it takes: (holder, needer, saved rank) for each folder a node lacks, sent by the lowest rank
    that holds it to the node's lowest rank that needs it. (None, []) if there is none."""
    nodes = [node for node, _ in offers]
    held_by = [{(saved, step, saved_world): whole_in for saved, step, saved_world, whole_in in o} for _, o in offers]
    for point in sorted({(s, w) for h in held_by for _, s, w in h}, reverse=True):
        moves = _moves(point, held_by, nodes)
        if moves is not None:
            return point, moves
    return None, []


def _moves(point: tuple[int, int], held_by: list[dict], nodes: list[str]) -> list | None:
    """The transfers the folders of ``point`` (step, saved world) take (plan's), or None where a folder some rank
    needs is held nowhere."""
    step, saved_world = point
    whole_of = {saved: whole_in for h in held_by for (saved, s, w), whole_in in h.items() if (s, w) == point}
    moves, planned = [], set()
    for needer, node in enumerate(nodes):
        # its own saved rank's folder and the one with the replicated state it names; a rank new since the save,
        # saved rank 0's replicated state
        wants = [needer, whole_of.get(needer)] if needer < saved_world else [whole_of.get(0)]
        for saved in dict.fromkeys(wants):
            if saved is None:
                return None
            key = (saved, step, saved_world)
            if key in held_by[needer] or (node, saved) in planned:
                continue
            holders = [h for h, held in enumerate(held_by) if key in held]
            if not holders:
                return None
            planned.add((node, saved))
            moves.append((holders[0], needer, saved))
    return moves


def choose(node: NodeStore, job: str, rank: int, gather, world: int | None = None, fetch=None,
           layout: str | None = None) -> Choice | None:
    """``gather(obj) -> list``: every rank's object (all ranks call this together). ``fetch(step, moves, folder_of)
    -> {saved rank: Path}``: the transfers of ``plan`` (every rank calls it with the same moves; ``folder_of(saved
    rank)``: this rank's checked folder of it to send, or None), returning the folders this rank received.
    ``layout``: a sharded model's (local_shards.layout): only its own folders of that layout and world size are
    read; None: only replicated state's. None (fetch None: only folders a rank's own node holds): no step whose
    folders every rank needs some rank holds."""
    where = f"{socket.gethostname()}:{node.path}"  # the ranks of one node (one memory) share it
    usable = [h for h in held(node, job) if h.sharded == (layout is not None)
              and (not h.sharded or (h.layout == layout and world in (None, h.world)))]
    refused: set[Path] = set()
    refused_before, said = 0, set()
    while True:
        offers = sorted({(h.saved_rank, h.step, h.world, h.whole_in) for h in usable if h.path not in refused})
        everyone = gather((where, offers))
        point, moves = plan(everyone)
        if point is None:
            return None
        step, saved_world = point
        if world is not None and rank == 0 and saved_world != world and point not in said:
            said.add(point)
            print(f"hpc: the fast tier's step {step} was saved at world size {saved_world}, this run has {world}: "
                  "its ranks' folders are read as a resume of the shared tier would read them", file=sys.stderr,
                  flush=True)
        at_point = [h for h in usable if (h.step, h.world) == point]
        pick = _checked(at_point, refused, rank, rank, step) if rank < saved_world else None
        received: dict[int, Path] = {}
        if moves and fetch is not None:
            received = fetch(step, moves, lambda saved: _checked(at_point, refused, saved, rank, step)) or {}
            if any(needer == saved == rank for _, needer, saved in moves):
                pick = _received(received.get(rank), step, rank, job, node.uid)
        found = None if moves and fetch is None or (pick is None and rank < saved_world) else \
            (pick.saved_rank if pick else None, pick.kind if pick else None, str(pick.path) if pick else None,
             pick is not None and pick.whole_in == pick.saved_rank)
        picks = gather((where, found))
        if all(p is not None for _, p in picks):
            # every rank has its own folder on its node now; the replicated state: its own folder's, or the folder
            # on its node its part names (saved rank 0's for a rank new since the save)
            want = pick.whole_in if pick is not None else 0
            whole = pick if pick is not None and want == pick.saved_rank else \
                _whole(node, job, point, refused, want, rank, where, picks)
            kind = None if whole is None else "own" if whole.kind == "own" and (pick is None or pick.kind == "own") \
                else "peer"
            kinds = gather(kind)
            if all(k is not None for k in kinds):
                return Choice(step, whole.path, "node" if all(k == "own" for k in kinds) else "peer",
                              part=pick.path if pick is not None and whole is not pick else None)
        # some rank has no good folder here: planned again without the folders found damaged (another node's copy
        # may serve), else an older point
        refusals = len(refused)
        if not any(gather(refusals > refused_before)):
            usable = [h for h in usable if (h.step, h.world) != point]
        refused_before = refusals


def _whole(node: NodeStore, job: str, point: tuple[int, int], refused: set[Path], want: int, rank: int, where: str,
           picks: list) -> Held | None:
    """This node's folder of saved rank ``want`` at ``point`` (a folder with the replicated state). Where a rank on
    this node picked it as its own, the very folder it checked (or was sent) is taken, not read again (a node of 8
    ranks would check the whole state 8 times); else this node's copy of it (perhaps just sent), checked here."""
    for their_node, found in picks:
        saved, kind, path, whole = found
        if their_node == where and saved == want and whole:
            return Held(point[0], kind, want, Path(path), point[1], want)
    found = [h for h in held(node, job) if (h.step, h.world) == point and h.path not in refused]
    return _checked(found, refused, want, rank, point[0])


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
