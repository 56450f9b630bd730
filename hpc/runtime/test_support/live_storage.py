"""Peak bytes of live tensor storage on one device type, counted exactly: a stand-in for a GPU's "allocated" peak
where there is no GPU (tests, CPU benchmarks). Load onto ``meta`` and count ``meta``: the bytes a device would hold,
apart from the host's; count ``cpu`` for the host's side of the same load.

Every op that runs under the mode notes the storages of its inputs and outputs; a storage counts until torch frees
it (a weak reference to the storage itself, not to a tensor: views, Parameters and hooks that share it keep it
counted). Bytes are storage bytes, not RSS: the allocator's caching and the interpreter are left out, and so is a
storage no op ever touched, so two runs of the same code give the same figure.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveStorage(TorchDispatchMode):
    """``with LiveStorage() as live: ...`` then ``live.peak`` and ``live.now`` (bytes). ``note(tensor)`` counts a
    tensor made outside any op (``torch.frombuffer``, a file read) from then on; ``inputs`` counts every storage an
    op reads as well as those it makes (a file's tensors read outside any op, but also tensors that were there
    before the mode began: leave it off to count only what the code under the mode made). ``ignore``: tensors whose
    storages never count (a model built on meta, when meta stands for the device it is loaded onto)."""

    def __init__(self, device_type: str = "cpu", inputs: bool = False, ignore=()):
        super().__init__()
        self.device_type = device_type
        self.inputs = inputs
        # keyed by the storage's address, which torch reuses once it is freed: an entry counts while its weak
        # reference lives, and a dead one is replaced by whatever storage took its address
        self._ignored = {t.untyped_storage()._cdata: StorageWeakRef(t.untyped_storage()) for t in ignore}
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0
        self.now = 0

    def note(self, tensor) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == self.device_type:
            storage = tensor.untyped_storage()
            key = storage._cdata
            ignored = self._ignored.get(key)
            if ignored is not None and not ignored.expired():
                return
            known = self._live.get(key)
            if known is None or known[0].expired():
                self._live[key] = (StorageWeakRef(storage), storage.nbytes())

    def measure(self) -> int:
        for key in [k for k, (ref, _) in self._live.items() if ref.expired()]:
            del self._live[key]
        self.now = sum(nbytes for _, nbytes in self._live.values())
        self.peak = max(self.peak, self.now)
        return self.now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for value in tree_flatten((args, kwargs))[0] if self.inputs else ():
            self.note(value)
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            self.note(value)
        self.measure()
        return out
