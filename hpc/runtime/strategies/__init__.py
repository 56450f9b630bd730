"""How a model is spread over processes. The facade picks one; backend differences live here only.

FSDP and DeepSpeed are imported only when chosen: their imports are heavy.
"""

from __future__ import annotations

from hpc.runtime.strategies.base import SingleProcess, Strategy
from hpc.runtime.strategies.ddp import DDPStrategy


def plugin_strategy(kind: str | None) -> type[Strategy] | None:
    """The strategy class a plugin kind names ("fsdp", "deepspeed", "megatron"); None for plain DDP / one process."""
    if kind == "fsdp":
        from hpc.runtime.strategies.fsdp import FSDPStrategy

        return FSDPStrategy
    if kind == "deepspeed":
        from hpc.runtime.strategies.deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy
    if kind == "megatron":
        from hpc.runtime.strategies.megatron import MegatronStrategy

        return MegatronStrategy
    return None


def choose(kind: str | None, state, handlers, plugin=None, **settings) -> Strategy:
    """``kind``: "ddp", "fsdp", "deepspeed" or None (DDP when there are several processes).
    ``settings``: mixed_precision and accumulation_steps, as every strategy takes them."""
    cls = plugin_strategy(kind)
    if cls is not None:
        return cls(state, handlers, plugin, **settings)
    return (DDPStrategy if state.distributed else SingleProcess)(state, handlers, **settings)


__all__ = ["Strategy", "SingleProcess", "DDPStrategy", "choose", "plugin_strategy"]
