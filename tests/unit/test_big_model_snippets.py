"""The big-model snippets of Accelerate's docs (the seeds' quicktour "Big Model Inference", the "Big Model
Inference" tutorial, "Loading big models into memory", "Model quantization" and the sharded "Saving and loading"
example), run under hpc with only their imports changed: each snippet below is the doc's text, and `run` rewrites
`from accelerate...` to `from hpc...` and nothing else. Where a snippet names a hub model, a tiny model built from a
config and local checkpoint files stand in (marked `# was ...`), and a GPU index becomes "cpu"; every dispatched
model must give the undispatched model's outputs exactly.

Side by side with Accelerate: each case takes the library to import (`case_*(assets, "accelerate")` runs the same
text under Accelerate); the device maps recorded below are Accelerate 1.15's for the same models and budgets, and
`HPC_ACCELERATE_SRC=<folder holding accelerate/> pytest ...` (opt-in: a second interpreter, ~40 s) reruns every case
under Accelerate and compares maps and outputs.

Not run here: `from_pretrained(device_map="auto")` (transformers imports the accelerate package itself:
test_big_models.py pins that) and bitsandbytes quantization (`BnbQuantizationConfig`, `load_and_quantize_model`:
CUDA only, and not part of hpc); the quantization page's device map runs, without quantization.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from hpc.errors import HpcError

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# the doc's own words, with the stand-ins marked "# was"

QUICKTOUR = """
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM

config = AutoConfig.from_pretrained(mixtral_folder)  # was "mistralai/Mixtral-8x7B-Instruct-v0.1"
with init_empty_weights():
    model = AutoModelForCausalLM.from_config(config)

from accelerate import load_checkpoint_and_dispatch

model = load_checkpoint_and_dispatch(
    model, checkpoint=mixtral_folder, device_map="auto", no_split_module_classes=['Block']
)
"""

TUTORIAL_PLAIN = """
import torch

my_model = ModelClass(...)
state_dict = torch.load(checkpoint_file)
my_model.load_state_dict(state_dict)
"""

TUTORIAL = """
import torch
from accelerate import init_empty_weights, load_checkpoint_and_dispatch

with init_empty_weights():
    model = MyModel(...)

model = load_checkpoint_and_dispatch(
    model, checkpoint=checkpoint_file, device_map="auto"
)

input = torch.randn(2,3)
input = input.to(device)  # was "cuda"
output = model(input)
"""

HUNDRED_BILLION = """
from accelerate import init_empty_weights

with init_empty_weights():
    model = nn.Sequential(*[nn.Linear(10000, 10000) for _ in range(1000)])
"""

SHARDED_INDEX = """
from accelerate import init_empty_weights, load_checkpoint_and_dispatch

with init_empty_weights():
    my_model = ModelClass(...)
model = load_checkpoint_and_dispatch(my_model, checkpoint=index_file, device_map="auto")  # the folder's index.json
"""

MINGPT = """
from accelerate import init_empty_weights
from mingpt.model import GPT

model_config = GPT.get_default_config()
model_config.model_type = model_type  # was 'gpt2-xl'
model_config.vocab_size = vocab_size  # was 50257
model_config.block_size = block_size  # was 1024

with init_empty_weights():
    model = GPT(model_config)
"""

MINGPT_AUTO = MINGPT + """
weights_location = sharded_folder  # was snapshot_download(repo_id="marcsun13/gpt2-xl-linear-sharded")

from accelerate import load_checkpoint_and_dispatch

model = load_checkpoint_and_dispatch(
    model, checkpoint=weights_location, device_map="auto", no_split_module_classes=['Block']
)
model.hf_device_map
outputs = model.generate(inputs, max_new_tokens=10, do_sample=False)[0]  # inputs: was tokenizer("Hello, my name is")
"""

MINGPT_OWN_MAP = MINGPT + """
weights_location = sharded_folder  # was snapshot_download(repo_id="marcsun13/gpt2-xl-linear-sharded")
from accelerate import load_checkpoint_and_dispatch  # the page's earlier snippet

device_map = {
    "transformer.wte": "cpu",
    "transformer.wpe": "cpu",  # was 0
    "transformer.drop": "cpu",
    "transformer.h.0": "disk"
}

model = load_checkpoint_and_dispatch(
    model, checkpoint=weights_location, device_map=device_map
)
"""

INFER_TWO_GPUS = """
from accelerate import infer_auto_device_map

device_map = infer_auto_device_map(my_model, max_memory={0: "10GiB", 1: "10GiB", "cpu": "30GiB"})
"""

BLOOM_MAX_MEMORY = """
from accelerate import infer_auto_device_map

max_memory = {0: "30GIB", 1: "46GIB", 2: "46GIB", 3: "46GIB", 4: "46GIB", 5: "46GIB", 6: "46GIB", 7: "46GIB"}
device_map = infer_auto_device_map(my_model, max_memory=max_memory, no_split_module_classes=["Block"])
"""

CPU_OFFLOAD = """
from accelerate import cpu_offload

cpu_offload(model, execution_device)
"""

CPU_OFFLOAD_PIPELINE = """
from accelerate import cpu_offload_with_hook

model_1, hook_1 = cpu_offload_with_hook(model_1, execution_device)
model_2, hook_2 = cpu_offload_with_hook(model_2, execution_device, prev_module_hook=hook_1)
model_3, hook_3 = cpu_offload_with_hook(model_3, execution_device, prev_module_hook=hook_2)

hid_1 = model_1(input)
for i in range(50):
    # model1 is offloaded on the CPU at the first iteration, model 2 stays on the GPU for this whole loop.
    hid_2 = model_2(hid_1)
# model2 is offloaded to the CPU just before this forward.
hid_3 = model_3(hid_2)  # was model_3(hid_3)

# For model3, you need to manually call the hook offload method.
hook_3.offload()
"""

DISK_OFFLOAD = """
from accelerate import disk_offload

disk_offload(model, offload_dir, execution_device)
"""

QUANTIZATION_MAP = """
device_map = {
    "transformer.wte": "cpu",  # was 0, as the next two
    "transformer.wpe": "cpu",
    "transformer.drop": "cpu",
    "transformer.h": "cpu",
    "transformer.ln_f": "disk",
    "lm_head": "disk",
}
"""

SAVE_SHARDED = """
from accelerate import Accelerator
from accelerate.utils import load_checkpoint_in_model

accelerator = Accelerator(cpu=True)
accelerator.wait_for_everyone()
accelerator.save_model(model, save_directory, max_shard_size="2KB", safe_serialization=True)  # was "1GB"

load_checkpoint_in_model(unwrapped_model, save_directory, device_map={"":device})
"""

_ACCELERATE_IMPORT = re.compile(r"^(\s*)(from|import) accelerate\b", re.MULTILINE)


def run(code: str, library: str = "hpc", **namespace) -> dict:
    """Run a snippet with its `accelerate` imports pointed at ``library``; its variables come back."""
    code = _ACCELERATE_IMPORT.sub(lambda m: f"{m[1]}{m[2]} {library}", textwrap.dedent(code))
    namespace = {"__name__": "snippet", "nn": nn, **namespace}
    exec(compile(code, "<snippet>", "exec"), namespace)
    return namespace


# stand-ins: small models with the snippets' shapes

class Block(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class ModelClass(nn.Module):
    """Takes the tutorial's `torch.randn(2,3)`."""

    def __init__(self, *_):
        super().__init__()
        self.linear_in = nn.Linear(3, 16)
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.norm = nn.LayerNorm(16)
        self.linear_out = nn.Linear(16, 3)

    def forward(self, x):
        x = self.linear_in(x)
        for block in self.blocks:
            x = block(x)
        return self.linear_out(self.norm(x))


class TwoLinears(nn.Module):
    """The sharded-checkpoint example's model: linear1 in the first shard, linear2 in the second."""

    def __init__(self, *_):
        super().__init__()
        self.linear1 = nn.Linear(4, 4)
        self.linear2 = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x)))


class ThreeLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1, self.linear2, self.linear3 = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.linear3(self.linear2(self.linear1(x)))


class TwoBlocks(nn.Module):
    """The "Designing a device map" example: block1 and block2, three linear layers each."""

    def __init__(self):
        super().__init__()
        self.block1, self.block2 = ThreeLinears(), ThreeLinears()

    def forward(self, x):
        return self.block2(self.block1(x))


class CausalSelfAttention(nn.Module):
    """minGPT's attention (github.com/karpathy/minGPT, model.py), its module names and persistent mask buffer."""

    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(0.0)
        self.resid_dropout = nn.Dropout(0.0)
        size = config.block_size
        self.register_buffer("bias", torch.tril(torch.ones(size, size)).view(1, 1, size, size))
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x):
        batch, steps, channels = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(batch, steps, self.n_head, channels // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        att = att.masked_fill(self.bias[:, :, :steps, :steps] == 0, float("-inf")).softmax(dim=-1)
        y = (self.attn_dropout(att) @ v).transpose(1, 2).contiguous().view(batch, steps, channels)
        return self.resid_dropout(self.c_proj(y))


class GPTBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(config.n_embd, 4 * config.n_embd), act=nn.GELU(),
                                      c_proj=nn.Linear(4 * config.n_embd, config.n_embd), dropout=nn.Dropout(0.0)))

    def forward(self, x):
        m = self.mlp
        x = x + self.attn(self.ln_1(x))
        return x + m.dropout(m.c_proj(m.act(m.c_fc(self.ln_2(x)))))


GPTBlock.__name__ = "Block"  # minGPT's class name, which the snippets pass in no_split_module_classes


class GPT(nn.Module):
    """minGPT's GPT, as `from mingpt.model import GPT` gives it: the snippets' model without the download."""

    SIZES = {"gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600), "gpt-nano": dict(n_layer=3, n_head=3, n_embd=48)}

    @staticmethod
    def get_default_config():
        return types.SimpleNamespace(model_type="gpt", n_layer=None, n_head=None, n_embd=None, vocab_size=None,
                                     block_size=None)

    def __init__(self, config):
        super().__init__()
        vars(config).update(self.SIZES[config.model_type])
        self.block_size = config.block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd), wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(0.0), h=nn.ModuleList([GPTBlock(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        positions = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(positions))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x)), None

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, do_sample=False, top_k=None):
        for _ in range(max_new_tokens):
            logits, _ = self(idx if idx.size(1) <= self.block_size else idx[:, -self.block_size:])
            _, next_id = torch.topk(logits[:, -1, :] / temperature, k=1, dim=-1)
            idx = torch.cat((idx, next_id), dim=1)
        return idx


MINGPT_MODULE = types.ModuleType("mingpt.model")
MINGPT_MODULE.GPT = GPT


def install_mingpt() -> None:
    """`from mingpt.model import GPT` finds the stand-in (minGPT is not installed here)."""
    sys.modules.setdefault("mingpt", types.ModuleType("mingpt"))
    sys.modules["mingpt.model"] = MINGPT_MODULE
TOKENS = torch.tensor([[496, 11, 616, 438, 318]])  # was tokenizer("Hello, my name is"): 15496, 11, 616, 1438, 318
NANO = dict(model_type="gpt-nano", vocab_size=1000, block_size=64)  # a small vocabulary and context: quick


def state_without_ties(model: nn.Module) -> dict:
    seen, state = set(), {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:  # a tied weight is stored once, as save_pretrained stores it
            seen.add(id(tensor))
            state[name] = tensor.detach().contiguous()
    return state


def write_shards(state: dict, folder: Path, shards: int = 3) -> Path:
    """A safetensors checkpoint in shards with its index, as save_pretrained or save_model write one."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(state)
    weight_map = {}
    for i in range(shards):
        part = names[i * len(names) // shards:(i + 1) * len(names) // shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k] for k in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


class Assets:
    """The models and checkpoint files the snippets load, built once each in ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._cache: dict = {}

    def _once(self, key, build):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def model_class(self):
        def build():
            torch.manual_seed(0)
            model = ModelClass().eval()
            torch.save(model.state_dict(), self.root / "model_class.bin")
            return model, self.root / "model_class.bin"
        return self._once("model_class", build)

    def mixtral(self):
        def build():
            import transformers

            config = transformers.MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                                num_local_experts=2, num_experts_per_tok=1, max_position_embeddings=32)
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config).eval()
            folder = self.root / "mixtral"
            config.save_pretrained(folder)
            # the model's own tensor names: transformers 5's save_pretrained writes the hub's older expert layout,
            # which only its own from_pretrained maps back
            save_file(state_without_ties(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
            return model, folder
        return self._once("mixtral", build)

    def two_linears(self):
        def build():
            torch.manual_seed(0)
            model = TwoLinears().eval()
            folder = self.root / "two_linears"
            folder.mkdir()
            state = model.state_dict()
            for file, layer in (("first_state_dict.bin", "linear1"), ("second_state_dict.bin", "linear2")):
                torch.save({k: v for k, v in state.items() if k.startswith(layer + ".")}, folder / file)
            index = {k: "first_state_dict.bin" if k.startswith("linear1.") else "second_state_dict.bin"
                     for k in state}
            (folder / "index.json").write_text(json.dumps(index))  # the page's index: name -> file, no weight_map
            return model, folder / "index.json"
        return self._once("two_linears", build)

    def mingpt(self):
        def build():
            torch.manual_seed(0)
            config = GPT.get_default_config()
            config.model_type, config.vocab_size, config.block_size = NANO.values()
            model = GPT(config).eval()
            return model, write_shards(state_without_ties(model), self.root / "gpt_nano_sharded").parent
        return self._once("mingpt", build)

    def mingpt_generated(self):
        return self._once("generated", lambda: self.mingpt()[0].generate(TOKENS, max_new_tokens=10, do_sample=False)[0])

    def gpt2_xl_on_meta(self):
        def build():
            from hpc import init_empty_weights

            config = GPT.get_default_config()
            config.model_type, config.vocab_size, config.block_size = "gpt2-xl", 50257, 1024
            with init_empty_weights(include_buffers=True):  # the 48 mask buffers too: 200 MB otherwise
                return GPT(config)
        return self._once("gpt2_xl", build)


def same(first, second) -> bool:
    return torch.equal(torch.as_tensor(first), torch.as_tensor(second))


# the cases: each runs its snippets under `library` and returns what is compared (maps; outputs beside the
# undispatched model's)

def case_quicktour(assets: Assets, library: str) -> dict:
    reference, folder = assets.mixtral()
    ns = run(QUICKTOUR, library, mixtral_folder=str(folder))
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.no_grad():
        return {"map": ns["model"].hf_device_map, "output": ns["model"](ids).logits, "expected": reference(ids).logits}


def case_tutorial(assets: Assets, library: str) -> dict:
    _, checkpoint = assets.model_class()
    plain = run(TUTORIAL_PLAIN, library, ModelClass=ModelClass, checkpoint_file=str(checkpoint))["my_model"].eval()
    torch.manual_seed(1)
    ns = run(TUTORIAL, library, MyModel=ModelClass, checkpoint_file=str(checkpoint), device="cpu")
    torch.manual_seed(1)
    with torch.no_grad():
        expected = plain(torch.randn(2, 3))
    return {"map": ns["model"].hf_device_map, "output": ns["output"].detach(), "expected": expected}


def case_sharded_index(assets: Assets, library: str) -> dict:
    reference, index = assets.two_linears()
    ns = run(SHARDED_INDEX, library, ModelClass=TwoLinears, index_file=str(index))
    x = torch.randn(3, 4)
    with torch.no_grad():
        return {"map": getattr(ns["model"], "hf_device_map", None), "output": ns["model"](x), "expected": reference(x)}


def case_mingpt_auto(assets: Assets, library: str) -> dict:
    _, folder = assets.mingpt()
    install_mingpt()
    ns = run(MINGPT_AUTO, library, **NANO, sharded_folder=str(folder), inputs=TOKENS)
    return {"map": ns["model"].hf_device_map, "output": ns["outputs"], "expected": assets.mingpt_generated()}


def case_mingpt_own_map(assets: Assets, library: str, tmp: Path) -> dict:
    """The page's map covers only four modules: Accelerate refuses it, so must hpc; completed (and with the offload
    folder its disk module needs) it runs."""
    _, folder = assets.mingpt()
    install_mingpt()
    namespace = dict(**NANO, sharded_folder=str(folder), inputs=TOKENS)

    def with_folder(code: str, offload: Path) -> str:
        changed = code.replace("device_map=device_map\n)", f"device_map=device_map, offload_folder={str(offload)!r}\n)")
        assert changed != code
        return changed

    refused = []  # no offload folder for its disk module; with one, no device for h.1 and the rest
    for attempt in (MINGPT_OWN_MAP, with_folder(MINGPT_OWN_MAP, tmp / "refused")):
        try:
            run(attempt, library, **namespace)
        except (ValueError, HpcError) as e:
            refused.append(f"{type(e).__name__}: {e}")
    completed = with_folder(MINGPT_OWN_MAP, tmp).replace(
        '"transformer.h.0": "disk"\n}', '"transformer.h.0": "disk", "transformer.h.1": "cpu", '
        '"transformer.h.2": "disk", "transformer.ln_f": "cpu", "lm_head": "cpu"}')
    assert "transformer.h.1" in completed
    ns = run(completed, library, **namespace)
    model = ns["model"]
    return {"refused": refused, "map": model.hf_device_map,
            "on_meta": sorted({n.split(".")[2] for n, p in model.named_parameters() if p.device.type == "meta"}),
            "output": model.generate(TOKENS, max_new_tokens=10, do_sample=False)[0],
            "expected": assets.mingpt_generated()}


def case_quantization_map(assets: Assets, library: str, tmp: Path) -> dict:
    """The quantization page's map, without quantization (bitsandbytes is CUDA only)."""
    reference, folder = assets.mingpt()
    install_mingpt()
    snippet = MINGPT + QUANTIZATION_MAP + (
        "from accelerate import load_checkpoint_and_dispatch\n"
        "model = load_checkpoint_and_dispatch(model, checkpoint=sharded_folder, device_map=device_map, "
        "offload_folder=offload_folder)\n")
    ns = run(snippet, library, **NANO, sharded_folder=str(folder), offload_folder=str(tmp))
    logits = ns["model"](TOKENS)[0]
    return {"map": ns["model"].hf_device_map, "output": logits, "expected": reference(TOKENS)[0],
            "offloaded": sorted(json.loads((tmp / "index.json").read_text()))}


def case_infer_maps(assets: Assets, library: str) -> dict:
    """The page's max_memory examples, on minGPT's gpt2-xl (on meta): deterministic, so equal to Accelerate's."""
    model = assets.gpt2_xl_on_meta()
    two = run(INFER_TWO_GPUS, library, my_model=model)["device_map"]
    bloom = run(BLOOM_MAX_MEMORY, library, my_model=model)["device_map"]
    utils = __import__(f"{library}.utils", fromlist=["get_balanced_memory"])
    # what device_map="auto" computes for two 4 GiB GPUs: the page's hf_device_map, h.0-h.21 / h.22-h.47
    balanced = utils.get_balanced_memory(model, max_memory={0: "4GiB", 1: "4GiB", "cpu": "30GiB"},
                                         no_split_module_classes=["Block"])
    auto = utils.infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=["Block"])
    small = utils.infer_auto_device_map(model, max_memory={0: "1GiB", 1: "2GiB", "cpu": "2GiB"},
                                        no_split_module_classes=["Block"])
    return {"map": {"two_gpus": list(two.items()), "bloom": list(bloom.items()), "auto": list(auto.items()),
                    "small": list(small.items()), "balanced": [(k, int(v)) for k, v in balanced.items()]}}


def case_device_map_examples(assets: Assets, library: str, tmp: Path) -> dict:
    """The page's three device maps: the first two cover the model, the third does not. They name GPUs: checked as
    written, then run with GPU 0 as "cpu" and GPU 1 as "disk"."""
    lib = __import__(library, fromlist=["dispatch_model"])
    check = __import__(f"{library}.utils", fromlist=["check_device_map"]).check_device_map
    maps = [{"block1": 0, "block2": 1}, {"block1": 0, "block2.linear1": 0, "block2.linear2": 1, "block2.linear3": 1},
            {"block1": 0, "block2.linear1": 1, "block2.linear2": 1}]
    verdicts = []
    for device_map in maps:
        try:
            check(TwoBlocks(), device_map)
            verdicts.append("valid")
        except (ValueError, HpcError):
            verdicts.append("invalid")
    torch.manual_seed(0)
    reference = TwoBlocks().eval()
    x = torch.randn(2, 4)
    outputs = []
    for device_map in maps[:2]:
        model = TwoBlocks()
        model.load_state_dict(reference.state_dict())
        on_cpu = {name: {0: "cpu", 1: "disk"}[device] for name, device in device_map.items()}
        model = lib.dispatch_model(model, on_cpu, offload_dir=str(tmp / f"offload{len(outputs)}"))
        with torch.no_grad():
            outputs.append(model(x))
    return {"verdicts": verdicts, "output": torch.stack(outputs),
            "expected": torch.stack([reference(x)] * 2).detach()}


def case_offload_only(assets: Assets, library: str, tmp: Path) -> dict:
    """"CPU offload only" and "Disk offload only": cpu_offload, the cpu_offload_with_hook pipeline, disk_offload."""
    reference, _ = assets.model_class()
    x = torch.randn(2, 3)

    def fresh():
        model = ModelClass().eval()
        model.load_state_dict(reference.state_dict())
        return model

    with torch.no_grad():
        expected = reference(x)
        on_cpu = run(CPU_OFFLOAD, library, model=fresh(), execution_device="cpu")["model"](x)
        on_disk = run(DISK_OFFLOAD, library, model=fresh(), offload_dir=str(tmp), execution_device="cpu")["model"](x)
        torch.manual_seed(2)
        first, second = nn.Linear(3, 3), nn.Linear(3, 3)
        expected_3 = reference(second(first(x)))
        pipeline = run(CPU_OFFLOAD_PIPELINE, library, model_1=first, model_2=second, model_3=fresh(),
                       execution_device="cpu", input=x)
    return {"output": torch.stack([on_cpu, on_disk, pipeline["hid_3"]]),
            "expected": torch.stack([expected, expected, expected_3])}


def case_save_sharded(assets: Assets, library: str, tmp: Path) -> dict:
    """"Saving and loading", the sharded checkpoint: save_model past max_shard_size, load_checkpoint_in_model."""
    reference, _ = assets.model_class()
    with __import__(library).init_empty_weights():
        empty = ModelClass()
    run(SAVE_SHARDED, library, model=reference, save_directory=str(tmp), unwrapped_model=empty, device="cpu")
    x = torch.randn(2, 3)
    files = sorted(p.name for p in tmp.iterdir())
    with torch.no_grad():
        return {"files": (files[-1], len(files) > 2), "output": empty(x), "expected": reference(x)}


# what Accelerate 1.15 gives for the same models and budgets (recorded by running these cases under it)
ACCELERATE_MAPS = {"quicktour": {"": "cpu"}, "tutorial": {"": "cpu"}, "sharded_index": {"": "cpu"},
                   "mingpt_auto": {"": "cpu"}}


def _layers(first: int, last: int, device) -> list:
    return [(f"transformer.h.{i}", device) for i in range(first, last + 1)]


_EMBEDDINGS = ["transformer.wte", "transformer.wpe", "transformer.drop"]
ACCELERATE_INFER_MAPS = {
    "two_gpus": [("", 0)],
    "bloom": [("", 0)],
    # the page's hf_device_map for gpt2-xl on two GPUs: h.0-h.21 on GPU 0, h.22-h.47 on GPU 1
    "auto": [(name, 0) for name in _EMBEDDINGS] + _layers(0, 21, 0) + _layers(22, 47, 1)
    + [("transformer.ln_f", 1), ("lm_head", 1)],
    "small": [(name, 0) for name in _EMBEDDINGS] + _layers(0, 2, 0) + _layers(3, 18, 1) + _layers(19, 32, "cpu")
    + _layers(33, 47, "disk") + [("transformer.ln_f", "disk"), ("lm_head", "disk")],
    "balanced": [(0, 3535654976), (1, 4294967296), ("cpu", 32212254720)],
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    yield Assets(tmp_path_factory.mktemp("snippet-assets"))
    for name in ("mingpt.model", "mingpt"):
        sys.modules.pop(name, None)


@pytest.fixture
def clean_env(monkeypatch):
    """The Accelerator of the save snippet is a world of one, whatever launched the tests."""
    for key in list(os.environ):
        if key.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "ACCELERATE_")):
            monkeypatch.delenv(key)


def _check_outputs(result: dict) -> None:
    assert same(result["output"], result["expected"]), "the dispatched model's outputs differ from the plain model's"


@pytest.mark.parametrize("case", [case_quicktour, case_tutorial, case_sharded_index, case_mingpt_auto],
                         ids=lambda c: c.__name__[5:])
def test_load_and_dispatch_snippets(assets, case):
    result = case(assets, "hpc")
    _check_outputs(result)
    assert result["map"] == ACCELERATE_MAPS[case.__name__[5:]]


def test_the_hundred_billion_parameter_skeleton_costs_nothing():
    model = run(HUNDRED_BILLION)["model"]
    assert sum(p.numel() for p in model.parameters()) == 100_010_000_000
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_the_pages_own_device_map_is_refused_and_the_completed_one_runs(assets, tmp_path):
    result = case_mingpt_own_map(assets, "hpc", tmp_path)
    # Accelerate: ValueError, for the same two reasons
    assert [reason.split(":")[0] for reason in result["refused"]] == ["HpcError", "HpcError"]
    assert "no offload_folder" in result["refused"][0] and "gives no device for" in result["refused"][1]
    _check_outputs(result)
    assert result["on_meta"] == ["0", "2"] and result["map"]["transformer.h.0"] == "disk"  # as Accelerate


def test_the_quantization_pages_device_map_without_quantization(assets, tmp_path):
    result = case_quantization_map(assets, "hpc", tmp_path)
    _check_outputs(result)
    assert result["offloaded"] == ["lm_head.weight", "transformer.ln_f.bias", "transformer.ln_f.weight"]


def test_device_maps_for_gpus_equal_accelerates(assets):
    with pytest.warns(UserWarning, match="buffers need"):  # "small" offloads 48 masks of 4 MB: Accelerate warns too
        maps = case_infer_maps(assets, "hpc")["map"]
    for name, recorded in ACCELERATE_INFER_MAPS.items():
        assert maps[name] == recorded, name


def test_designing_a_device_map_examples(assets, tmp_path):
    result = case_device_map_examples(assets, "hpc", tmp_path)
    assert result["verdicts"] == ["valid", "valid", "invalid"]
    _check_outputs(result)


def test_cpu_and_disk_offload_only(assets, tmp_path):
    _check_outputs(case_offload_only(assets, "hpc", tmp_path))


def test_save_model_sharded_then_load_checkpoint_in_model(assets, tmp_path, clean_env):
    result = case_save_sharded(assets, "hpc", tmp_path)
    _check_outputs(result)
    assert result["files"] == ("model.safetensors.index.json", True)  # shards and their index


CASES_WITH_TMP = {case_mingpt_own_map, case_quantization_map, case_device_map_examples, case_offload_only,
                  case_save_sharded}
ALL_CASES = [case_quicktour, case_tutorial, case_sharded_index, case_mingpt_auto, case_mingpt_own_map,
             case_quantization_map, case_infer_maps, case_device_map_examples, case_offload_only, case_save_sharded]


def run_all(library: str, root: Path) -> dict:
    """Every case under ``library``: {case: result}. What the side-by-side comparison runs in each library."""
    assets = Assets(root / "assets")
    assets.root.mkdir(parents=True, exist_ok=True)
    results = {}
    for case in ALL_CASES:
        args = (assets, library)
        if case in CASES_WITH_TMP:
            (root / case.__name__).mkdir()
            args += (root / case.__name__,)
        results[case.__name__] = case(*args)
    return results
