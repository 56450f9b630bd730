"""hpc.runtime.checkpoint.device_load: a checkpoint file read once into device memory through pinned buffers, its
CRC verified beside the copy. On the CPU the same code runs (unpinned buffers); the CUDA path differs only in
pin_memory, non_blocking and the events, and scripts/gpu_smoke.sh runs it on a GPU."""

from __future__ import annotations

import pytest
import torch

from hpc.errors import HpcError
from hpc.runtime.checkpoint import device_load, manifest


def _state():
    torch.manual_seed(0)
    base = torch.randn(1000, 33)
    return {"model": {"w": base, "w_t": base.t(), "row": base[7], "half": torch.randn(513).half(),
                      "ids": torch.arange(10_000), "flag": torch.tensor(True), "empty": torch.empty(0)},
            "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(77, 5)}},
                          "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.99), "params": [0]}]}}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_loads_what_torch_load_does_in_chunks_with_shared_storage_kept(tmp_path):
    path = tmp_path / "state.pt"
    torch.save(_state(), path)
    stats = device_load.LoadStats()
    got = device_load.load(path, "cpu", stats=stats, chunk=4096)
    assert _same(got, torch.load(path, weights_only=True))
    model = got["model"]
    # one storage for the weight and its views, as torch.load gives: copied once, still shared
    assert model["w_t"].untyped_storage().data_ptr() == model["w"].untyped_storage().data_ptr()
    assert model["row"].data_ptr() == model["w"][7].data_ptr()
    model["w"][7, 0] = 42.0
    assert model["row"][0] == 42.0
    unique = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in
              [*torch.load(path, weights_only=True)["model"].values()]}
    assert stats.bytes_copied == sum(unique.values()) + 77 * 5 * 4 + 4
    assert stats.chunks > stats.storages  # the weight (132 kB) went in several 4 kB chunks


def test_the_checksum_is_verified_in_the_same_pass(tmp_path):
    path = tmp_path / "state.pt"
    torch.save(_state(), path)
    entry = manifest.file_entry(path)
    stats = device_load.LoadStats()
    device_load.load(path, "cpu", expect=entry, stats=stats)
    assert stats.crc_bytes == entry["size"] == path.stat().st_size
    with pytest.raises(HpcError, match="corrupt"):
        device_load.load(path, "cpu", expect={**entry, "crc32": f"{int(entry['crc32'], 16) ^ 1:08x}"})
    with pytest.raises(HpcError, match="corrupt"):
        device_load.load(path, "cpu", expect={**entry, "size": entry["size"] + 1})


class Planted:
    """Any class of the caller's: unpickling it could run code."""


def test_a_file_needing_more_than_tensors_is_refused(tmp_path):
    path = tmp_path / "state.pt"
    torch.save({"x": Planted()}, path)
    with pytest.raises(HpcError, match="refused"):
        device_load.load(path, "cpu")
