"""`get_logger`: a logger that speaks once (on the main process) unless asked otherwise, as Accelerate's does.

``logger.info(msg)`` logs on rank 0 only; ``main_process_only=False`` logs on every rank; ``in_order=True`` logs
rank by rank (a barrier between each, so every rank must call it). Messages carry ``[RANK i]``. The level comes
from ``log_level``, else ``ACCELERATE_LOG_LEVEL`` (what `accelerate launch` users set), else the logger's own.
Unlike Accelerate, no Accelerator needs to exist first: the rank comes from the launcher's variables.
"""

from __future__ import annotations

import functools
import logging
import os


def _rank_and_world() -> tuple[int, int]:
    from hpc.contract import launch_env as env

    found = env.detect()
    return found.rank, found.world_size


def _barrier() -> None:
    import sys

    dist = sys.modules.get("torch.distributed")  # no process group without torch already imported
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()


class MultiProcessAdapter(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        kwargs.setdefault("stacklevel", 2)  # the caller's line (logging skips its own frames), not this one
        return f"[RANK {_rank_and_world()[0]}] {msg}", kwargs

    def log(self, level, msg, *args, main_process_only: bool = True, in_order: bool = False, **kwargs):
        if not self.isEnabledFor(level):
            return
        msg, kwargs = self.process(msg, kwargs)
        rank, world = _rank_and_world()
        if in_order:
            for turn in range(world):
                if turn == rank:
                    self.logger.log(level, msg, *args, **kwargs)
                _barrier()
        elif not main_process_only or rank == 0:
            self.logger.log(level, msg, *args, **kwargs)

    @functools.lru_cache(None)  # noqa: B019 - one warning per message for the adapter's life, as Accelerate's
    def warning_once(self, *args, **kwargs):
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    log_level = log_level or os.environ.get("ACCELERATE_LOG_LEVEL")
    logger = logging.getLogger(name)
    if log_level:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
