"""Where an epoch stands, in terms that do not depend on the job's shape.

A rank's batch count means nothing once the world size, the per-rank batch or split_batches changes: at world 2
with 4 samples a rank, batch 3 is sample 24 of the epoch; at world 1 it would be sample 12. So a checkpoint records
how much of the epoch's order was consumed, counted in the order's own units:

- "sample": the loader knows its sample order (a sampler with a batch size, or a stream of collated batches of a
  known size): samples consumed, whatever the batches they went in;
- "item": the order is a sequence of whole batches (a batch sampler of the user's, a loader that does not batch,
  a stream whose batches have no fixed size): batches of that sequence consumed.

The shape it was consumed in (world, per-rank batch, split) is kept beside it, for notes and for checkpoints of
earlier hpc versions, which recorded only the rank's batch count.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc.errors import HpcError

UNITS = ("sample", "item")


@dataclass(frozen=True)
class Shape:
    """How the ranks took the epoch: world size, each rank's batch (None: batches of no fixed size), split."""

    world: int
    batch_size: int | None
    split: bool

    def round_units(self, unit: str) -> int:
        """How much of the epoch's order one batch of every rank takes."""
        if unit == "item":
            return 1 if self.split else self.world
        if self.batch_size is None:
            raise HpcError("a loader whose batches have no fixed size is counted in batches, not samples",
                           fix="give the DataLoader a batch_size")
        return self.batch_size * self.world

    def item_size(self) -> int | None:
        """The samples in one batch of the loader's own order (split_batches cuts each among the ranks)."""
        if self.batch_size is None:
            return None
        return self.batch_size * (self.world if self.split else 1)

    def describe(self) -> str:
        batch = "batches of no fixed size" if self.batch_size is None else f"batch {self.batch_size} per rank"
        return f"world {self.world}, {batch}{', split_batches' if self.split else ''}"


@dataclass(frozen=True)
class EpochPoint:
    """``consumed`` units of epoch ``epoch``'s order are behind (trained, or handed out to nobody)."""

    epoch: int
    consumed: int
    unit: str
    shape: Shape

    def state(self, batches: int) -> dict:
        """What a checkpoint records; ``batches`` is the rank's batch count, kept for earlier hpc versions."""
        return {"epoch": self.epoch, "position": batches, "consumed": self.consumed, "unit": self.unit,
                "world": self.shape.world, "batch_size": self.shape.batch_size, "split": self.shape.split}

    @classmethod
    def from_state(cls, state: dict, unit: str, shape: Shape, saved_world: int | None) -> EpochPoint:
        """A checkpoint's point. One of an earlier hpc holds the rank's batch count only: it is read in the shape it
        was saved in (the manifest's world size, today's batch sizes), the one thing that can be known of it."""
        epoch = int(state["epoch"])
        if "consumed" in state:
            if state.get("unit") != unit:
                raise HpcError(f"the checkpoint counts its loader's position in {state.get('unit')}s, and this "
                               f"loader in {unit}s: the loader is not the one that was saved",
                               fix="resume with the same kind of loader (sampler or batch sampler, map or stream)")
            saved = Shape(int(state.get("world", shape.world)), state.get("batch_size", shape.batch_size),
                          bool(state.get("split", shape.split)))
            return cls(epoch, int(state["consumed"]), unit, saved)
        saved = Shape(saved_world or shape.world, shape.batch_size, shape.split)
        return cls(epoch, int(state["position"]) * saved.round_units(unit), unit, saved)
