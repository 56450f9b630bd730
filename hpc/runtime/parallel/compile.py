"""torch.compile of each prepared model, as Accelerate's TorchDynamoPlugin asks (dynamo_backend & co)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from hpc.errors import HpcError
from hpc.runtime.handlers import KwargsHandler


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """Accelerate's torch.compile settings object: Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="inductor")).
    A field left None is read, as Accelerate reads it, from ACCELERATE_DYNAMO_BACKEND, _MODE, _USE_FULLGRAPH,
    _USE_REGIONAL_COMPILATION and _USE_DYNAMIC (what `accelerate launch` exports from a config file). ``backend``
    is kept by Accelerate's upper-case name, equal to hpc.utils.DynamoBackend's member (a str enum); to_dict and
    to_kwargs give the lower-case name torch takes."""

    backend: str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: dict | None = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self):
        env = os.environ
        backend = env.get(f"{DYNAMO_PREFIX}BACKEND", "no") if self.backend is None else self.backend
        self.backend = str(getattr(backend, "value", backend)).upper()
        if self.mode is None:
            self.mode = env.get(f"{DYNAMO_PREFIX}MODE", "default")
        if self.fullgraph is None:
            self.fullgraph = _true(env.get(f"{DYNAMO_PREFIX}USE_FULLGRAPH", "False"))
        if self.use_regional_compilation is None:
            self.use_regional_compilation = _true(env.get(f"{DYNAMO_PREFIX}USE_REGIONAL_COMPILATION", "False"))
        if self.dynamic is None and f"{DYNAMO_PREFIX}USE_DYNAMIC" in env:
            self.dynamic = _true(env[f"{DYNAMO_PREFIX}USE_DYNAMIC"])

    @property
    def backend_name(self) -> str:
        return str(self.backend).lower()

    def to_dict(self) -> dict:
        return {**super().to_dict(), "backend": self.backend_name}

    def as_settings(self) -> dict:
        """The job keys these stand for (what dynamo_backend & co. of a config file set)."""
        if self.options:
            raise HpcError("TorchDynamoPlugin(options=...) is not passed on by hpc", fix="drop options, or set mode")
        return {"dynamo_backend": None if self.disable else self.backend_name, "dynamo_mode": self.mode,
                "dynamo_use_fullgraph": self.fullgraph, "dynamo_use_dynamic": self.dynamic,
                "dynamo_use_regional_compilation": self.use_regional_compilation}


DYNAMO_PREFIX = "ACCELERATE_DYNAMO_"


def _true(value: str) -> bool:
    """Accelerate's str_to_bool for these variables: y, yes, t, true, on, 1 or n, no, f, false, off, 0."""
    word = value.strip().lower()
    if word not in ("y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0"):
        raise HpcError(f"an ACCELERATE_DYNAMO_* variable is {value!r}, not a yes or no", fix="set it to true or false")
    return word in ("y", "yes", "t", "true", "on", "1")


@dataclass(frozen=True)
class Compile:
    backend: str | None = None  # None or "no": models are left as they are
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    regional: bool = False  # compile each block of a repeated stack (nn.ModuleList) instead of the whole model

    @classmethod
    def from_settings(cls, settings: dict) -> "Compile":
        backend = settings.get("dynamo_backend")
        return cls(backend=None if backend in (None, "no", "NO") else str(backend).lower(),
                   mode=None if settings.get("dynamo_mode") in (None, "default") else settings["dynamo_mode"],
                   fullgraph=bool(settings.get("dynamo_use_fullgraph")),
                   dynamic=settings.get("dynamo_use_dynamic"),
                   regional=bool(settings.get("dynamo_use_regional_compilation")))

    def __call__(self, model: torch.nn.Module, inner: torch.nn.Module | None = None) -> torch.nn.Module:
        """Compile ``inner`` (the model inside a DDP wrapper or DeepSpeed engine) in place; return ``model``."""
        if self.backend is None:
            return model
        if self.backend not in torch._dynamo.list_backends(exclude_tags=()):
            raise HpcError(f"dynamo_backend={self.backend!r} is not a torch.compile backend here",
                           fix=f"use one of {', '.join(sorted(torch._dynamo.list_backends(exclude_tags=())))}")
        options = {"backend": self.backend, "mode": self.mode, "fullgraph": self.fullgraph, "dynamic": self.dynamic}
        # in place (Module.compile), not torch.compile's wrapper: state_dict keys, checkpoints and
        # isinstance checks stay what they were
        target = inner if inner is not None else model
        blocks = [b for m in target.modules() if isinstance(m, torch.nn.ModuleList) for b in m] if self.regional else []
        for block in blocks or [target]:  # a block compiled once serves every repeat: time does not grow with depth
            block.compile(**options)
        return model
