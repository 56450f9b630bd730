"""Reading a checkpoint's files without running code from them.

A checksum proves a file is what the save wrote, not who wrote it: anyone who can write the folder (a shared
project directory) can rewrite a file and its manifest entry. So nothing in a checkpoint is unpickled: every
torch file loads with ``weights_only=True`` (tensors, numbers, strings and containers), with at most a short,
named allowlist of plain-data classes. A file that needs more is refused in one line naming it and the opt-in,
``HPC_TRUST_CHECKPOINT_PICKLES=1``, for state the user trusts (a registered object whose state_dict holds
arbitrary Python objects).
"""

from __future__ import annotations

import os
import pickle
import sys

from hpc.errors import HpcError

TRUST_ENV = "HPC_TRUST_CHECKPOINT_PICKLES"


def trusted() -> bool:
    """Whether the user opted in to unpickling what weights_only refuses (HPC_TRUST_CHECKPOINT_PICKLES=1)."""
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")


def note_trusted(what) -> None:
    """One line for each file unpickled under the opt-in: what ran is on record in the job's log."""
    print(f"hpc: unpickling {what} ({TRUST_ENV}=1)", file=sys.stderr, flush=True)


def refused(what, why: str, fix: str | None = None) -> HpcError:
    """The one-line refusal of a file (or an entry of one) that would need unpickling."""
    return HpcError(f"{what}: {why}; refused: loading it could run code planted by whoever can write the folder",
                    fix=fix or f"set {TRUST_ENV}=1 (hpc merge-weights: --trust-pickles) only if you trust "
                                    "everyone who can write it")


def load(source, map_location=None, allow: list | tuple = (), name: str | None = None, mmap: bool = False):
    """``torch.load(source, weights_only=True)`` with ``allow`` (objects, or (object, "old.module.name") pairs) as
    the only extra globals; what needs more is an HpcError (naming ``name``, default the path), or, with the
    opt-in, an ordinary load. ``mmap``: tensors are read from the file when used (a file path only)."""
    import torch

    try:
        with torch.serialization.safe_globals(list(allow)):
            if mmap:
                try:
                    return torch.load(source, map_location=map_location, weights_only=True, mmap=True)
                except RuntimeError as e:
                    if "mmap" not in str(e):
                        raise
                    # torch's legacy (pre-1.6) format cannot be mapped: read whole, still with weights_only
            return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if hasattr(source, "seek"):
            source.seek(0)
        if trusted():
            note_trusted(name or source)
            return torch.load(source, map_location=map_location, weights_only=False)
        raise refused(name or source, f"holds Python objects weights_only refuses ({_unsafe_globals(source, e)})") \
            from None


def _unsafe_globals(source, error: Exception) -> str:
    import torch

    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(source)
    except Exception:  # noqa: BLE001 - naming them is a courtesy; the refusal stands either way
        names = []
    if names:
        return ", ".join(sorted(names)[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return str(error).strip().splitlines()[-1][:200]
