"""The fast tier's copy of the weights and optimizer state, taken beside the next step's forward and backward.

A fast save is staged at the first batch after a step. Of its state, the model's parameters and the optimizer's
state (the bulk of it) change only in the next ``optimizer.step()``: forward and backward read them and write
gradients. So those are copied on the writer thread while the loop goes on, and a pre-hook on every optimizer's
step waits for the copy to land: the loop is held only where the copy takes longer than a forward and backward.
Everything else (buffers, which a forward may change in place, such as batch norm's running statistics; the
schedulers; the random streams; the readers) is copied on the training thread at once, as before.

Each deferred tensor's version counter (bumped by every in-place change through the tensor or a view of it) is read
at staging and again after its copy. A script that changed a parameter in place before the optimizer step (an EMA
update written into the trained model, a weight clip ahead of the step) changes a counter: that save is dropped,
never committed, and the tier copies on the training thread from then on, with one line. What torch does not count
cannot be seen: a change through ``.data`` (``p.data.clamp_()``) made before the copy reached it. That is why this
is the profile's ``fast_tier.overlap_copy``, off by default: a job turns it on knowing its script changes no weight
between a step's end and the next optimizer step.

CPU tensors only: a GPU tensor's device-to-pinned copy is fast and stays on the training thread (untested on a GPU
yet, so not moved).
"""

from __future__ import annotations

import threading
import time
import weakref

import torch


class DeferredCopy:
    """Tensors whose copy into staging buffers is left to the writer thread, guarded by the optimizers' steps."""

    def __init__(self):
        self.on = True
        self._pending: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._landed = threading.Event()
        self._landed.set()
        self._hooked: set[int] = set()
        self.waited_s = 0.0  # the loop's wait in the optimizers' pre-hooks since the last take

    def sources(self, models, optimizers) -> set[int]:
        """The storages the optimizers' steps alone change: the models' parameters and the optimizers' state."""
        if not self.on:
            return set()
        ptrs = {p.data_ptr() for m in models for p in m.parameters() if p.device.type == "cpu"}
        for optimizer in optimizers:
            for state in _inner(optimizer).state.values():
                ptrs.update(t.data_ptr() for t in state.values()
                            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel())
        return ptrs

    def defer(self, source: torch.Tensor, buffer: torch.Tensor) -> None:
        self._pending.append((source, buffer, source._version))
        self._landed.clear()

    def guard(self, optimizers) -> None:
        """A pre-hook on each optimizer's step (once each): wait for the copy to land before the state changes."""
        ref = weakref.ref(self)
        for optimizer in optimizers:
            inner = _inner(optimizer)
            if id(inner) in self._hooked:
                continue
            self._hooked.add(id(inner))
            inner.register_step_pre_hook(lambda *_: (c := ref()) is not None and c.wait_landed())

    def wait_landed(self) -> None:
        if not self._landed.is_set():
            started = time.monotonic()
            self._landed.wait()
            self.waited_s += time.monotonic() - started

    def land(self) -> str | None:
        """On the writer thread: copy what was deferred. None when every source was unchanged meanwhile; else why
        the copy is no snapshot (the save must be dropped)."""
        pending, self._pending = self._pending, []
        try:
            changed = 0
            for source, buffer, version in pending:
                buffer.copy_(source)
                changed += source._version != version
        finally:
            self._landed.set()
        if changed:
            return (f"{changed} tensor(s) of the weights or optimizer state changed in place between the step's end "
                    "and the next optimizer step")
        return None

    def take_waited(self) -> float:
        waited, self.waited_s = self.waited_s, 0.0
        return waited


def _inner(optimizer):
    return getattr(optimizer, "optimizer", optimizer)
