"""Each rank's committed fast-tier folder, sent to the same local rank of the next node (rank r -> r + local world
size, mod world; nvidia-resiliency-ext's "replication jump") over a gloo group of its own, and the previous node's
received and committed here as a peer copy. Only plain bytes cross: a header of names and sizes (JSON) and the
files; the copy is committed under the sender's manifest only once every file matches its checksum.

Every rank takes part in every exchange, in the same order (a rank with nothing to send sends an empty header), so
no rank waits on one that skipped; the group's timeout bounds the wait for a node that died.
"""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from hpc.runtime.checkpoint import manifest
from hpc.runtime.checkpoint.crc import crc32

GROUP_TIMEOUT_S = 120.0


class Replication:
    """``group``: a gloo group of every rank (made by all ranks together, at the same point of the run)."""

    def __init__(self, rank: int, world: int, local_world: int, group, copies: bool):
        self.rank, self.world, self.group = rank, world, group
        self.copies = copies and world > local_world  # another node to keep a copy on; else the group only votes
        self.peer = (rank + local_world) % world  # who keeps a copy of this rank's folder
        self.source = (rank - local_world) % world  # whose folder this rank keeps a copy of

    @classmethod
    def make(cls, rank: int, world: int, local_world: int, copies: bool) -> Replication | None:
        """None with one process (nobody to tell, nobody to send to). ``copies``: send each folder to the next
        node (the profile's replicas 2), where there is one."""
        if world <= 1 or not dist.is_available() or not dist.is_initialized():
            return None
        return cls(rank, world, local_world, make_group(), copies)

    def exchange(self, folder: Path | None, receive_into) -> tuple[Path | None, bool]:
        """Send ``folder`` (a committed checkpoint; None: nothing this time) to the peer and take the source's.
        ``receive_into(step, saved rank) -> Path``: where the source's copy of ``step`` goes. Returns (the copy
        committed here or None, whether the peer committed ours)."""
        payload = _pack(folder) if folder is not None else bytearray()
        size = torch.tensor([len(payload)], dtype=torch.int64)
        theirs = torch.zeros(1, dtype=torch.int64)
        _both(dist.isend(size, self.peer, group=self.group), dist.irecv(theirs, self.source, group=self.group))
        data = torch.empty(int(theirs.item()), dtype=torch.uint8)
        sends = [dist.isend(torch.frombuffer(payload, dtype=torch.uint8), self.peer, group=self.group)] \
            if payload else []
        if data.numel():
            dist.irecv(data, self.source, group=self.group).wait()
        for work in sends:
            work.wait()
        copy = _unpack(memoryview(data.numpy()), self.source, receive_into) if data.numel() else None
        ack, peer_ack = torch.tensor([int(copy is not None)]), torch.zeros(1, dtype=torch.int64)
        _both(dist.isend(ack, self.source, group=self.group), dist.irecv(peer_ack, self.peer, group=self.group))
        return copy, bool(peer_ack.item())

    def vote(self, failed: bool, drained: bool) -> tuple[bool, bool]:
        """Whether any rank's fast save failed this time, and whether rank 0 drained it into the shared tier
        (every rank learns the same answers)."""
        flags = torch.tensor([int(failed), int(drained and self.rank == 0)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flags[0].item()), bool(flags[1].item())


def transfer(group, rank: int, moves: list[tuple[int, int, int]], folder_of, receive_into) -> dict[int, Path]:
    """A resume's fetches (choice.plan's moves: holder, needer, saved rank), every rank calling with the same moves:
    each holder sends its folder of the saved rank (``folder_of(saved) -> Held | None``; none: an empty message),
    each needer receives it and commits it (``receive_into(step, saved rank)``) once every file matches its
    checksum. Returns what this rank received: {saved rank: folder}."""
    keep, sends, received, packed = [], [], {}, {}
    for holder, needer, saved in moves:
        if holder != rank:
            continue
        if saved not in packed:  # one buffer a folder, however many nodes it goes to (a grow: several)
            held = folder_of(saved)
            packed[saved] = _pack(held.path) if held is not None else bytearray()
        payload = packed[saved]
        size = torch.tensor([len(payload)], dtype=torch.int64)
        keep.append((payload, size))
        sends.append(dist.isend(size, needer, group=group))
        if payload:
            sends.append(dist.isend(torch.frombuffer(payload, dtype=torch.uint8), needer, group=group))
    for holder, needer, saved in moves:
        if needer != rank:
            continue
        size = torch.zeros(1, dtype=torch.int64)
        dist.irecv(size, holder, group=group).wait()
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        if data.numel():
            dist.irecv(data, holder, group=group).wait()
            folder = _unpack(memoryview(data.numpy()), saved, receive_into)
            if folder is not None:
                received[saved] = folder
    for work in sends:
        work.wait()
    return received


def make_group():
    """A gloo group of every rank for the fast tier's bytes (the job's own group may be NCCL's)."""
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))


def _both(send, recv) -> None:
    recv.wait()
    send.wait()


def _pack(folder: Path) -> bytearray:
    """One buffer (its bytes handed to gloo as they are): header length, header, the files in the header's order."""
    data = manifest.read(folder)
    names = sorted(data["files"])
    header = json.dumps({"manifest": data, "names": names}).encode()
    out = bytearray(8 + len(header) + sum(int(data["files"][n]["size"]) for n in names))
    out[:8], out[8:8 + len(header)] = len(header).to_bytes(8, "little"), header
    at = 8 + len(header)
    for name in names:
        with open(folder / name, "rb", buffering=0) as f:
            at += f.readinto(memoryview(out)[at:at + int(data["files"][name]["size"])])
    return out


def _unpack(blob: memoryview, saved: int, receive_into) -> Path | None:
    """Write the received files (saved rank ``saved``'s folder), check each against the sender's manifest, commit:
    the copy, or None (another rank's, damaged in transit, or the tier is full: nothing half-written is left)."""
    length = int.from_bytes(bytes(blob[:8]), "little")
    header = json.loads(bytes(blob[8:8 + length]))
    data, names = header["manifest"], header["names"]
    if manifest.malformed(data, formats=manifest.FAST_TIER_FORMATS) or sorted(data["files"]) != names \
            or data.get("rank") != saved:
        return None
    folder = Path(receive_into(int(data["step"]), saved))
    shutil.rmtree(folder, ignore_errors=True)
    at = 8 + length
    try:
        for name in names:
            want = data["files"][name]
            content = blob[at:at + want["size"]]
            at += want["size"]
            # checked from memory as it is written (no thread pool: this may run as the interpreter shuts down)
            if len(content) != want["size"] or f"{crc32(content):08x}" != want["crc32"]:
                raise OSError(f"{name} does not match its checksum")
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        meta = {k: v for k, v in data.items() if k not in ("files", "version", "committed_at")}
        manifest.commit(folder, data["files"], meta, fsync=False)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return folder
