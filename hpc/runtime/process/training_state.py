"""What one training run has: the objects prepare() returned and the counters, shared by the Accelerator with
its helpers (the checkpointer saves and restores them, the optimizer wrapper counts steps, the prepared loaders
report progress) so that none of them reaches into the Accelerator's own attributes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


def _nothing(*_args) -> None:
    return None


@dataclass(eq=False)
class TrainingState:
    models: list = field(default_factory=list)
    optimizers: list = field(default_factory=list)
    schedulers: list = field(default_factory=list)
    loaders: list = field(default_factory=list)
    custom_objects: list = field(default_factory=list)
    completed_steps: int = 0  # optimizer steps taken (accumulation windows closed)
    micro_step: int = 0  # micro-steps seen by accumulate() (the Accelerator's `step`)
    micro_step_at_step: int = 0  # micro_step as the last optimizer step left it (what a checkpoint records)
    # what the owner does at these moments; the run guard resumes before the first work, feeds its hang
    # watchdog on progress and paces checkpoints on steps. A loader prepared without one does nothing.
    before_work: Callable[[], None] = _nothing
    on_progress: Callable[[str], None] = _nothing
    on_step: Callable[[], None] = _nothing
    # a prepared loader is about to hand out a batch (loader, whether it is the pass's first): a point where the
    # script's previous step is over, with everything it did after it (scheduler, counters, its own saves)
    before_batch: Callable[[Any, bool], None] = _nothing

    def optimizer_stepped(self, optimizer: Any) -> None:
        """An optimizer stepped: one count per window, however many optimizers the run has. What the loaders
        handed out up to here is trained: a checkpoint taken before the next step goes back to this point (the
        batches of a window still open have gradients no checkpoint holds, and are trained again)."""
        if self.optimizers[:1] == [optimizer]:
            self.completed_steps += 1
            self.micro_step_at_step = self.micro_step
            for loader in self.loaders:
                loader.stepped()
            self.on_step()

    @property
    def saved_micro_step(self) -> int:
        """The micro-step a checkpoint records: the last optimizer step's, with the data going back there."""
        return self.micro_step_at_step if self.optimizers else self.micro_step

    def positions(self) -> list[dict]:
        """Where each prepared loader's epoch stands, whatever the job's shape (what a checkpoint records)."""
        return [loader.point().state(loader.position) for loader in self.loaders]

    def clear(self) -> None:
        for objects in (self.models, self.optimizers, self.schedulers, self.loaders):
            objects.clear()
        self.micro_step = 0
