"""How a model is spread over processes. The facade picks one; backend differences live here only.

FSDP and DeepSpeed are imported only when chosen: their imports are heavy.
"""

from __future__ import annotations

from hpc.runtime.strategies.base import SingleProcess, Strategy
from hpc.runtime.strategies.ddp import DDPStrategy


def choose(kind: str | None, state, handlers, plugin=None) -> Strategy:
    """``kind``: "ddp", "fsdp", "deepspeed" or None (DDP when there are several processes)."""
    if kind == "fsdp":
        from hpc.runtime.strategies.fsdp import FSDPStrategy

        return FSDPStrategy(state, handlers, plugin)
    if kind == "deepspeed":
        from hpc.runtime.strategies.deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(state, handlers, plugin)
    return DDPStrategy(state, handlers) if state.distributed else SingleProcess(state, handlers)


__all__ = ["Strategy", "SingleProcess", "DDPStrategy", "choose"]
