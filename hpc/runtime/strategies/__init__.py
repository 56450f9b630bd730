"""How a model is spread over processes. The facade picks one; backend differences live here only."""

from __future__ import annotations

from hpc.runtime.strategies.base import SingleProcess, Strategy
from hpc.runtime.strategies.ddp import DDPStrategy


def choose(state, handlers) -> Strategy:
    return DDPStrategy(state, handlers) if state.distributed else SingleProcess(state, handlers)


__all__ = ["Strategy", "SingleProcess", "DDPStrategy", "choose"]
