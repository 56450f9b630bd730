"""What a model loaded whole onto one device holds while it runs (issue 35: hpc's GPU peak over load_checkpoint_and_
dispatch and three forwards of a GPT-2 was reported above Accelerate's). Counted in live storage bytes
(hpc.runtime.test_support.live_storage) on the CPU, and with meta standing for the GPU (its storages are counted,
nothing is computed): a model dispatched to one device gets no hooks and no second copy of any tensor, and its
forward holds exactly what a model built plainly holds: the model, the KV cache, the logits, one hidden state and
the input ids (scripts/bench/big_model_gpu_peak.py's "floor"); nothing stays between forwards.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

from hpc.runtime.big_models.dispatch import load_checkpoint_and_dispatch
from hpc.runtime.big_models.empty_init import init_empty_weights
from hpc.runtime.test_support.live_storage import LiveStorage

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

BATCH, SEQ = 2, 16


def _config():
    return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=3000, n_positions=64)


@pytest.fixture
def folder(tmp_path):
    """A tied-head GPT-2 as save_pretrained writes it (safetensors; the head is not stored)."""
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(_config()).save_pretrained(tmp_path, safe_serialization=True)
    return tmp_path


def _model_bytes(model) -> int:
    return sum(t.nbytes for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}.values())


def _storage_bytes(model) -> int:
    """Bytes of the distinct storages behind the model's tensors: a tensor held twice counts twice."""
    storages = {(t.device.type, t.untyped_storage().data_ptr()): t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers()]}
    return sum(storages.values())


def _floor(model, size: int) -> int:
    config, itemsize, tokens = model.config, model.transformer.wte.weight.element_size(), BATCH * SEQ
    cache = config.n_layer * 2 * tokens * config.n_embd * itemsize  # keys and values of every layer
    return size + cache + tokens * config.vocab_size * itemsize + tokens * config.n_embd * itemsize + tokens * 8


def _empty(folder):
    config = transformers.GPT2Config.from_pretrained(folder)
    with init_empty_weights():
        model = transformers.GPT2LMHeadModel(config)
    model.tie_weights()
    return model.eval()


def _ids(model, device_type: str):
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return ids.to(device_type)


def _load(folder, device_map):
    """The model, its size (the tied head once), and the load's peak and what it left, in live host bytes."""
    model = _empty(folder)
    size = _model_bytes(model)
    with LiveStorage("cpu") as load:
        model = load_checkpoint_and_dispatch(model, folder, device_map=device_map)
    gc.collect()
    return model, size, load.peak, load.measure()


def _forwards(model, device_type: str) -> list[tuple[int, int]]:
    """(peak, after) in live storage bytes of three forwards, as the GPU benchmark runs them."""
    ids = _ids(model, device_type)
    found = []
    with torch.no_grad():
        for _ in range(3):
            with LiveStorage(device_type, inputs=True) as live:
                for t in [*model.parameters(), *model.buffers(), ids]:
                    live.note(t)
                logits = model(input_ids=ids).logits
                del logits
                gc.collect()
                after = live.measure()
            found.append((live.peak, after))
    return found


def _plain(folder):
    """The same weights in a model built plainly, no big-model API: the reference for what a forward holds."""
    model = transformers.GPT2LMHeadModel.from_pretrained(folder)
    return model.eval()


@pytest.mark.parametrize("device_map", [{"": "cpu"}, "auto"])
def test_a_model_dispatched_whole_gets_no_hooks_and_holds_itself_once(folder, device_map):
    if device_map == "auto" and torch.cuda.is_available():
        pytest.skip("'auto' puts the model on the GPU here")
    model, size, load_peak, after = _load(folder, device_map)
    assert model.hf_device_map == {"": "cpu"}
    assert not [name for name, m in model.named_modules() if hasattr(m, "_hf_hook") or "forward" in vars(m)]
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.config._attn_implementation == _plain(folder).config._attn_implementation
    assert load_peak == after == _storage_bytes(model) == _model_bytes(model) == size


def test_the_forward_holds_what_a_plainly_built_model_holds(folder):
    model, size, _, _ = _load(folder, {"": "cpu"})
    dispatched, reference = _forwards(model, "cpu"), _forwards(_plain(folder), "cpu")
    assert dispatched == reference
    assert dispatched == [(_floor(model, size), size + BATCH * SEQ * 8)] * 3, \
        "more than the model, its KV cache, the logits, one hidden state and the ids"


def test_on_meta_standing_for_the_gpu_the_device_holds_the_model_then_the_floor(folder):
    """The device side alone, counted over the load and the forwards as a GPU's allocator counts them: the load
    puts the model there and nothing more; each forward's peak is the floor, and only the model and the ids stay.
    (On meta the head stays the empty model's placeholder, uncounted: there is no data to tie it to, as
    Accelerate's retie_parameters also leaves it; it has the embedding's shape, so the logits are counted.)"""
    model = _empty(folder)
    size = _model_bytes(model)
    found = []
    with LiveStorage("meta", inputs=True, ignore=[*model.parameters(), *model.buffers()]) as device:
        model = load_checkpoint_and_dispatch(model, folder, device_map={"": "meta"})
        gc.collect()
        found.append((device.peak, device.measure()))
        assert not [name for name, m in model.named_modules() if hasattr(m, "_hf_hook") or "forward" in vars(m)]
        ids = _ids(model, "meta")
        with torch.no_grad():
            for _ in range(3):
                device.peak = device.measure()
                logits = model(input_ids=ids).logits
                del logits
                gc.collect()
                found.append((device.peak, device.measure()))
    assert found == [(size, size)] + [(_floor(model, size), size + BATCH * SEQ * 8)] * 3
