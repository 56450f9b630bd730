"""A file written whole or not at all, with no name another user can plant a link at.

A temporary name beside the destination that anyone can predict (`.NAME.tmp`, `.NAME.tmp<pid>`) lets whoever
can write that folder put a symlink there first, and the writer then overwrites the link's target. The file
is written instead inside a fresh folder that mkdtemp creates with an unpredictable name, O_EXCL and mode 0700
(nobody else can enter it, let alone plant a link), and renamed into place from there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def folder(beside: Path, name: str = "tmp") -> Iterator[Path]:
    """A fresh private folder in ``beside`` (the destination's folder: a rename from it never copies), removed
    with whatever is left in it when the block ends."""
    beside = Path(beside)
    beside.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=beside))
    try:
        yield private
    finally:
        shutil.rmtree(private, ignore_errors=True)


@contextlib.contextmanager
def writing(out: Path) -> Iterator[Path]:
    """Yield the path to write ``out``'s content at; once the block ends without an error, it becomes ``out``
    (the rename replaces a link planted at ``out`` itself, never its target)."""
    out = Path(out)
    with folder(out.parent, out.name) as private:
        tmp = private / out.name
        yield tmp
        os.replace(tmp, out)
