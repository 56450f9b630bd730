"""A model's size as `hpc estimate-memory` tables it: measured in the runtime (torch), tabled on the login side."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelSize:
    """What the per-dtype table needs. Bytes are at fp32, as Accelerate builds the model, buffers included."""

    parameters: int
    total_bytes: int
    largest_layer_bytes: int | None = None  # None for a bare count: there are no layers to look at
    largest_layers: list[str] = field(default_factory=list)
