"""How much more memory the job may take before its cgroup's limit kills it, for the fast tier's saves.

A tmpfs (/dev/shm) page is charged to the memory cgroup of the process that wrote it, and it cannot be reclaimed:
on a cluster that enforces ``--mem`` (SLURM's task/cgroup), a fast-tier save that fits the tmpfs can still push the
job over its limit, and the kernel's OOM killer ends the job. So a save must fit both the tier's free space and the
job's headroom: the tightest limit on the way from this process's cgroup to the root, less what is charged there
and cannot be given back (anonymous memory and tmpfs; the page cache can be). cgroup v2 and v1 alike.
"""

from __future__ import annotations

from pathlib import Path

NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63


def headroom(proc_cgroup: str | None = None, root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes of unreclaimable memory the job may still take, or None where no limit applies (or none is readable)."""
    try:
        text = proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    v1 = next((parts[2] for parts in (line.split(":", 2) for line in text.splitlines())
               if len(parts) == 3 and "memory" in parts[1].split(",")), None)
    if v1 is not None and (root / "memory").is_dir():
        return _tightest(root / "memory", v1, _v1_level)
    v2 = next((line.split(":", 2)[2] for line in text.splitlines() if line.startswith("0::")), None)
    if v2 is not None and (root / "cgroup.controllers").exists():
        return _tightest(root, v2, _v2_level)
    return None


def _tightest(mount: Path, path: str, level) -> int | None:
    """The smallest headroom of the cgroup at ``path`` and its ancestors (those visible: in a container the
    process's own cgroup is often the mount's root)."""
    folder = mount / path.strip("/")
    if not folder.is_dir():
        folder = mount
    best = None
    while True:
        room = level(folder)
        if room is not None:
            best = room if best is None else min(best, room)
        if folder == mount:
            return best
        folder = folder.parent


def _stat(folder: Path) -> dict[str, int]:
    out = {}
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
    except OSError:
        pass
    return out


def _number(path: Path) -> int | None:
    try:
        value = path.read_text().strip()
    except OSError:
        return None
    return int(value) if value.isdigit() else None  # v2's "max": no limit


def _v2_level(folder: Path) -> int | None:
    limit = _number(folder / "memory.max")
    if limit is None or limit >= NO_LIMIT:
        return None
    stat = _stat(folder)
    return limit - stat.get("anon", 0) - stat.get("shmem", 0)


def _v1_level(folder: Path) -> int | None:
    limit = _number(folder / "memory.limit_in_bytes")
    if limit is None or limit >= NO_LIMIT:
        return None
    stat = _stat(folder)  # total_*: this cgroup and those below it
    return limit - stat.get("total_rss", stat.get("rss", 0)) - stat.get("total_shmem", stat.get("shmem", 0))
