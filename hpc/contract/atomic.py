"""Files written whole or not at all: readers (the other side, a requeued attempt, `hpc status`) see the old
content or the new, never half; and a crash leaves at most a hidden temp file, never a damaged real one.

The temp file lies beside the target (a rename within one filesystem is atomic), has a name no one can guess
ahead (``.NAME.tmp<pid>-<random>``), is created exclusively without following links and readable by this user
only until it takes the real name, with the mode asked for (default: what the umask gives a new file).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


def _umask_mode() -> int:
    # the umask can only be read by setting it: for that instant it is the strictest one, so a file another thread
    # creates meanwhile comes out more private, never less
    mask = os.umask(0o077)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, mode: int | None = None, fsync: bool = False,
              new: bool = False) -> Iterator[Path]:
    """Yield a private temp path to write ``path``'s new content at (and check it there); when the block ends
    without an error it takes ``path``'s name, else it is removed. The temp name ends in ``path``'s suffix, so a
    loader that goes by it reads the temp file as it will read the real one. ``new``: ``path`` must not exist;
    if it does (made meanwhile too), FileExistsError and nothing is replaced."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{secrets.token_hex(4)}{path.suffix}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, _umask_mode() if mode is None else mode)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            os.link(tmp, path)  # fails where path exists: the check and the write are one step
            tmp.unlink()
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def append_whole(path: str | os.PathLike, text: str, *, mode: int = 0o600) -> None:
    """``text`` (whole lines) appended in one write with O_APPEND: appends of concurrent processes (ranks, attempts)
    never interleave on a local or NFS filesystem. A new file gets ``mode``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: str | bytes, *, mode: int | None = None,
                 fsync: bool = False, new: bool = False) -> None:
    """``path`` holds ``data`` afterwards, written whole (see the module's docstring); with ``new``, only if it did
    not exist (FileExistsError otherwise)."""
    with replacing(path, mode=mode, fsync=fsync, new=new) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
