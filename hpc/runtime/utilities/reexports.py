"""Names an Accelerate module path also binds because Accelerate's file imports them (`from accelerate.accelerator
import gather` works, as `accelerate.accelerator.gather is accelerate.utils.gather`): each is the object at its own
path in hpc, looked up on first use, so importing one path does not load every other. Torch-free."""

from __future__ import annotations

import importlib


class Forwarding:
    """A module's PEP 562 lookup: ``table`` maps each hpc module to the names read from it. ``logger`` (which
    Accelerate's modules define as their own multi-process logger) is made for the module on first use."""

    def __init__(self, module_name: str, table: dict[str, list[str]], logger: bool = False):
        self.module_name, self.logger = module_name, logger
        self.source = {name: module for module, names in table.items() for name in names}

    def __call__(self, name: str):
        if name in self.source:
            return getattr(importlib.import_module(self.source[name]), name)
        if name == "logger" and self.logger:
            from hpc.runtime.tracking.rank_logging import get_logger

            module = importlib.import_module(self.module_name)
            module.logger = get_logger(self.module_name)  # once: later lookups find it as a plain attribute
            return module.logger
        raise AttributeError(f"module {self.module_name!r} has no attribute {name!r}")

    def names(self) -> list[str]:
        module = importlib.import_module(self.module_name)
        return sorted({*vars(module), *self.source, *(["logger"] if self.logger else [])})
