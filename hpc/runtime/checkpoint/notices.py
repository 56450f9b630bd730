"""Where rank 0 saved at a point of training, told to the other ranks through the process group's key-value store.

A replicated checkpoint (one process, DDP) is saved by each rank alone, with no collective: Accelerate's scripts
call save_state on the main process only. A rank that saved its own part (its RNG) learns here which folder
holds the shared state of the same point, and whether rank 0 is saving there at all. A store key is a request
to the store's server, never a collective: ranks that do not ask are not waited for.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch.distributed as dist

from hpc.errors import HpcError


def _store():
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:  # the default group's store: private in torch, but there since 1.x
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError):
        return None


def _key(at: tuple[int, int]) -> str:
    return f"hpc/checkpoint/{at[0]}:{at[1]}"


def announce(at: tuple[int, int], folder) -> None:
    """Rank 0: at this point of training (step, micro_step), the shared state goes to ``folder``."""
    store = _store()
    if store is not None:
        store.set(_key(at), str(folder))


def where(at: tuple[int, int], timeout_s: float) -> str | None:
    """The folder rank 0 saved in at this point (waiting up to ``timeout_s`` for it to say), or None."""
    store = _store()
    if store is None:
        return None
    try:
        store.wait([_key(at)], timedelta(seconds=timeout_s))
    except RuntimeError:  # DistStoreError on a timeout: rank 0 never saved at this point
        return None
    return store.get(_key(at)).decode()


_SAVING = "hpc/checkpoint/saving"


def saving(now: bool) -> None:
    """Rank 0: a replicated save is (no longer) being written; the other ranks' hang watchdogs wait for it."""
    store = _store()
    if store is not None:
        store.set(_SAVING, "1" if now else "0")


def peer_saving() -> bool:
    """Whether rank 0 is writing a replicated checkpoint now (read from the hang watchdog's thread)."""
    store = _store()
    try:
        return store is not None and store.check([_SAVING]) and store.get(_SAVING) == b"1"
    except RuntimeError:  # the store's host is gone: nothing to wait for
        return False


class Arrivals:
    """Sharded state is saved and loaded by every rank together: before the first collective, each rank says it
    has come, and waits (bounded) for the others. A script that saves on one rank only (diffusers' pattern,
    fine for DDP) then gets an error naming the cause instead of a collective that never returns."""

    def __init__(self, world: int, timeout_s: float):
        self.world, self.timeout_s = world, timeout_s
        self._calls: dict[str, int] = {}

    def wait(self, what: str, fix: str) -> None:
        store = _store()
        if store is None or self.world <= 1:
            return
        n = self._calls[what] = self._calls.get(what, 0) + 1
        key = f"hpc/arrivals/{what}/{n}"
        here, deadline = store.add(key, 1), time.monotonic() + self.timeout_s
        while here < self.world:
            if time.monotonic() > deadline:
                raise HpcError(f"{what} was called on {here} of {self.world} ranks (waited {self.timeout_s:.0f} s "
                               "for the others): this job's state is sharded, so every rank must call it", fix=fix)
            time.sleep(0.05)
            here = store.add(key, 0)
