"""GradientState: where gradient accumulation and the data stand, shared by every instance in a process (as
Accelerate's is), so code far from the Accelerator (a model's forward, a callback) can ask `GradientState()`.

`sync_gradients`: this micro-step ends an accumulation window (gradients are reduced, the optimizer steps).
`end_of_dataloader`/`remainder`: the active prepared loader is at its last batch, and how many of that batch's
samples are real (the rest repeat the epoch's first samples to keep ranks even; gather_for_metrics drops them).
"""

from __future__ import annotations

from typing import Any


class GradientState:
    _shared_state: dict = {}

    def __init__(self, gradient_accumulation_plugin=None):
        self.__dict__ = self._shared_state
        if not self._shared_state:
            self.sync_gradients = True
            self.end_of_dataloader = False
            self.remainder = -1
            self.dataloader_references: list = [None]
            self.plugin_kwargs: dict[str, Any] = {}
            self.is_xla_gradients_synced = False
        if gradient_accumulation_plugin is not None:
            self.plugin_kwargs = {key: getattr(gradient_accumulation_plugin, key) for key in
                                  ("num_steps", "adjust_scheduler", "sync_with_dataloader", "sync_each_batch")}

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared_state.clear()

    @property
    def initialized(self) -> bool:
        return bool(self._shared_state)

    @property
    def num_steps(self) -> int:
        return self.plugin_kwargs.get("num_steps", 1)

    @property
    def adjust_scheduler(self) -> bool:
        return self.plugin_kwargs.get("adjust_scheduler", False)

    @property
    def sync_with_dataloader(self) -> bool:
        return self.plugin_kwargs.get("sync_with_dataloader", True)

    @property
    def sync_each_batch(self) -> bool:
        return self.plugin_kwargs.get("sync_each_batch", False)

    @property
    def active_dataloader(self):
        return self.dataloader_references[-1]

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    def enter_dataloader(self, loader) -> None:
        self.end_of_dataloader, self.remainder = False, -1
        self.dataloader_references.append(loader)

    def leave_dataloader(self, loader) -> None:
        if loader in self.dataloader_references:
            self.dataloader_references.remove(loader)
        self.end_of_dataloader, self.remainder = False, -1

    # Accelerate's private spellings, which some integrations call
    _add_dataloader = enter_dataloader
    _remove_dataloader = leave_dataloader

    def __repr__(self) -> str:
        return (f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
                f"Extra samples added: {self.remainder}\nGradient accumulation plugin: {self.plugin_kwargs}\n")
