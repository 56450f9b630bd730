"""Accelerate's state.py helpers: the storage its singleton states share, and do_nothing.

Accelerate keeps each state's shared dict per thread only under PyTorch/XLA's multithreaded PJRT (TPU v2/v3);
hpc runs no XLA, so SharedDict is a plain dict, as Accelerate's is wherever XLA is absent. ThreadLocalSharedDict
exists and works (a descriptor holding one dict per thread) for code that builds it itself."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger(__name__)  # Accelerate's state logger is a plain one too


def do_nothing(*args, **kwargs):
    """Stands in for a function a process skips (Accelerate passes it where a rank has nothing to run)."""
    return None


class ThreadLocalSharedDict(threading.local):
    """A descriptor whose dict is shared by the instances of a class in one thread: `obj._shared_state` and
    `cls._shared_state` give the same dict; assigning through an instance replaces it for the thread."""

    def __init__(self, thread_local: bool = False):
        self._storage = {}

    def __get__(self, obj, objtype=None):
        return self._storage

    def __set__(self, obj, value):
        self._storage = value


SharedDict = dict  # no XLA here: one dict per process, as Accelerate's without XLA
