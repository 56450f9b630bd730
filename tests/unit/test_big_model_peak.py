"""The memory a big-model load holds at once (issue 35: hpc's GPU peak was above Accelerate's for a GPT-2 loaded
whole onto one GPU). No GPU here: the model is loaded onto ``meta``, whose storages stand for the device's (their
bytes are counted, nothing is written), and the host's side is counted apart (hpc.runtime.test_support.live_storage).

Accelerate's design is the bound: the device holds the model in its final dtype and nothing else (each tensor is
cast where it is read, then copied once), and the host holds one checkpoint tensor and its cast at a time.
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

from hpc.runtime.big_models.empty_init import init_empty_weights
from hpc.runtime.big_models.loading import load_checkpoint_in_model
from hpc.runtime.test_support.live_storage import LiveStorage

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def _gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=3000, n_positions=64)
    with init_empty_weights():
        model = transformers.GPT2LMHeadModel(config)
    model.tie_weights()
    return model


def _checkpoint(tmp_path, with_head: bool):
    """One safetensors file of a GPT-2's weights in float32; ``with_head``: the tied lm_head stored as well (as
    torch.save of a state_dict, and some converters, write it). Its largest tensor, the embedding, is read last."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(_gpt2().config)
    state = {k: v.clone() for k, v in model.state_dict().items() if with_head or k != "lm_head.weight"}
    path = tmp_path / "model.safetensors"
    save_file(state, str(path), metadata={"format": "pt"})
    return path, max(t.nbytes for t in state.values())


def _model_bytes(dtype=None) -> int:
    """The bytes of the model's own tensors (a tied one once) in the dtype the load gives them."""
    model = _gpt2()
    unique = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    return sum(t.numel() * (dtype or t.dtype).itemsize if t.is_floating_point() else t.nbytes for t in unique)


def _load(path, dtype=None):
    model = _gpt2()
    device = LiveStorage("meta", ignore=[*model.parameters(), *model.buffers()])  # the meta model is no load
    with device, LiveStorage("cpu", inputs=True) as host:
        load_checkpoint_in_model(model, path, device_map={"": "meta"}, dtype=dtype)
    return model, device.peak, host.peak


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_the_device_holds_the_model_and_nothing_more(tmp_path, dtype):
    path, _ = _checkpoint(tmp_path, with_head=False)
    _, device_peak, _ = _load(path, dtype)
    assert device_peak == _model_bytes(dtype)


def test_a_tied_weight_stored_twice_is_not_put_on_the_device_twice(tmp_path):
    """Before: the head's copy went to the device beside the embedding until retie_parameters dropped one (on a
    355M GPT-2, 196 MiB more at the peak)."""
    path, _ = _checkpoint(tmp_path, with_head=True)
    _, device_peak, _ = _load(path)
    assert device_peak == _model_bytes(), f"{device_peak - _model_bytes()} bytes more (a second head?)"


def test_a_tied_weight_stored_twice_loads_tied_with_the_checkpoints_values(tmp_path):
    path, _ = _checkpoint(tmp_path, with_head=True)
    model = _gpt2()
    load_checkpoint_in_model(model, path, device_map={"": "cpu"})
    assert model.lm_head.weight is model.transformer.wte.weight
    from safetensors.torch import load_file

    saved = load_file(str(path))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())


def test_the_host_holds_one_tensor_and_its_cast(tmp_path):
    """Before: every tensor was cast twice on the host (once for nothing), so the largest was held three times."""
    path, largest = _checkpoint(tmp_path, with_head=False)
    _, _, host_peak = _load(path, torch.bfloat16)
    assert host_peak <= largest + largest // 2
