"""The fast tier's copy of the weights and optimizer state, taken beside the next step's forward and backward.

A fast save is staged at the first batch after a step. Of its state, the model's parameters and the optimizer's
state (the bulk of it) change only in the next ``optimizer.step()``: forward and backward read them and write
gradients. So those are copied on the writer thread while the loop goes on, and a pre-hook on every optimizer's
step waits for the copy to land: the loop is held only where the copy takes longer than a forward and backward.
Everything else (buffers, which a forward may change in place, such as batch norm's running statistics; the
schedulers; the random streams; the readers) is copied on the training thread at once, as before.

Each deferred tensor's version counter (bumped by every in-place change through the tensor or a view of it) is read
at staging and again on the training thread once the copy has landed (in the optimizer's pre-hook, or as the
training thread waits for the save), where any in-place change the script made meanwhile has finished; the writer
commits only on that verdict. A script that changed a parameter in place before the optimizer step (an EMA
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
    """Tensors whose copy into staging buffers is left to the writer thread, guarded by the optimizers' steps.

    The writer copies (land), then waits for the training thread's verdict (verify: in the optimizer's pre-hook, or
    when the training thread waits for the save), taken where every in-place change the script made has finished:
    a change still running as the copy read its tensor has bumped the counter by then."""

    def __init__(self, on: bool = True):
        self.on = on
        self._pending: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._landed = threading.Event()
        self._landed.set()
        self._verified = threading.Event()
        self._verified.set()
        self._verdict: str | None = None
        self._landed_pending: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._hooks: dict[int, object] = {}  # inner optimizer id -> its hook's handle
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
        self._verified.clear()

    def guard(self, optimizers) -> None:
        """A pre-hook on each optimizer's step (once each): the copy lands and is judged before the state changes."""
        ref = weakref.ref(self)

        def before_step(*_) -> None:  # a hook that returns anything but None makes torch raise
            copy = ref()
            if copy is not None:
                copy.verify()

        for optimizer in optimizers:
            inner = _inner(optimizer)
            if id(inner) not in self._hooks:
                self._hooks[id(inner)] = inner.register_step_pre_hook(before_step)

    def verify(self, timeout: float | None = None) -> None:
        """On the training thread: wait for the copy to land, then judge it (the writer commits or drops on it)."""
        if self._verified.is_set():
            return
        started = time.monotonic()
        landed = self._landed.wait(timeout)
        self.waited_s += time.monotonic() - started
        if not landed or self._verified.is_set():
            return
        changed = sum(source._version != version for source, _, version in self._landed_pending)
        self._verdict = None if not changed else (
            f"{changed} tensor(s) of the weights or optimizer state changed in place between the step's end and the "
            "next optimizer step")
        self._verified.set()

    def land(self) -> str | None:
        """On the writer thread: copy what was deferred, then wait for the training thread's verdict. None when
        the copy is the step's snapshot; else why not (the save must be dropped)."""
        pending, self._pending = self._pending, []
        if not pending:
            return None
        self._landed_pending = pending
        try:
            for source, buffer, _ in pending:
                buffer.copy_(source)
        finally:
            self._landed.set()
        self._verified.wait()
        return self._verdict

    def take_waited(self) -> float:
        waited, self.waited_s = self.waited_s, 0.0
        return waited

    def close(self) -> None:
        """The run is over: the optimizers' pre-hooks go (an optimizer may outlive the tier)."""
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()


def _inner(optimizer):
    return getattr(optimizer, "optimizer", optimizer)
