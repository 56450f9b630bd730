"""A write-through file that computes its CRC-32 on another thread while each large buffer is written.

Checksumming after the write would read every byte twice; hashing in line would add ~40% to a save.
The CRC releases the GIL for large buffers, so the hash of a buffer runs beside its write (no copy: write
returns only when both are done), and a save costs about what a plain torch.save does.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path

from hpc.runtime.checkpoint.crc import crc32

_PARALLEL = 1 << 20  # smaller writes are hashed in line: a thread hand-off costs more than the hash


class HashingWriter:
    def __init__(self, path: Path, fsync: bool = False):
        self.path, self.fsync = Path(path), fsync
        self.size, self._crc = 0, 0
        self._file = open(self.path, "wb")
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._hash, name="hpc-crc", daemon=True)
        self._thread.start()

    def _hash(self) -> None:
        while (view := self._jobs.get()) is not None:
            self._crc = crc32(view, self._crc)
            self._done.put(None)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if n < _PARALLEL:
            self._crc = crc32(view, self._crc)
            self._file.write(view)
        else:
            self._jobs.put(view)
            self._file.write(view)
            self._done.get()  # the caller may reuse its buffer once write returns
        self.size += n
        return n

    def flush(self) -> None:
        self._file.flush()

    def _stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    def close(self) -> dict:
        self._stop()
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self._file.close()
        return {"size": self.size, "crc32": f"{self._crc:08x}"}

    def __enter__(self) -> "HashingWriter":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self._stop()
            self._file.close()
