"""The memory estimator and its command: accounting per strategy, the cheapest fit, model folders, Accelerate's
per-dtype table, bad input."""

import json
import os
import subprocess
import sys

import pytest

from hpc.cli.model_measure import measure
from hpc.cluster.estimate import STRATEGIES, Shape, cheapest_fit, estimate, parse_count
from hpc.errors import HpcError
from hpc.runtime.big_models.model_shapes import model_size

P = 1_000_000


@pytest.mark.parametrize("strategy,precision,world,per_param", [
    ("ddp", "no", 8, 16), ("ddp", "bf16", 8, 16),           # autocast keeps fp32 weights and gradients
    ("zero1", "bf16", 4, 2 + 2 / 4 + 12 / 4),               # as measured: DeepSpeed's stage 1 = stage 2 in bytes
    ("zero2", "bf16", 4, 2 + 2 / 4 + 12 / 4),
    ("zero3", "bf16", 4, (2 + 2 + 12) / 4),
    ("zero3", "no", 2, (4 + 4 + 12) / 2),                   # DeepSpeed's fp32 master copy is still there
    ("fsdp", "bf16", 4, 16 / 4), ("fsdp_grad_op", "no", 2, 16 / 2),
])
def test_state_bytes_per_strategy(strategy, precision, world, per_param):
    assert estimate(P, strategy, precision=precision, world_size=world).state_bytes == int(per_param * P)


def test_offload_moves_state_to_the_host_and_sharding_shrinks_with_world_size():
    off = estimate(P, "zero3_offload", precision="bf16", world_size=4)
    assert (off.params, off.optimizer, off.grads) == (0, 0, 0) and off.host == (2 + 2 + 12) * P // 4
    sizes = [estimate(P, "fsdp", world_size=n).state_bytes for n in (1, 2, 4, 8)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 16 * P


def test_cheapest_fit_prefers_less_sharding():
    ests = [estimate(7 * 10**9, s, precision="bf16", world_size=8) for s in STRATEGIES]
    assert cheapest_fit(ests, 40 * 2**30).strategy == "zero1"
    assert cheapest_fit(ests, 20 * 2**30).strategy == "fsdp_grad_op"
    shape = Shape(batch_size=8, seq_len=4096, hidden_size=4096, layers=32)  # ~36 GiB of activations alone
    with_activations = [estimate(7 * 10**9, s, precision="bf16", world_size=8, shape=shape) for s in STRATEGIES]
    assert cheapest_fit(with_activations, 30 * 2**30) is None


def test_activations_follow_the_transformer_formula():
    shape = Shape(batch_size=1, seq_len=2048, hidden_size=4096, layers=32)
    assert estimate(P, "ddp", precision="bf16", shape=shape).activations == 34 * 2048 * 4096 * 32
    ckpt = Shape(1, 2048, 4096, 32, checkpointing=True)
    assert ckpt.activation_bytes(2) < shape.activation_bytes(2) / 4


@pytest.mark.parametrize("text,count", [("7B", 7 * 10**9), ("125M", 125 * 10**6), ("1.3e9", 1_300_000_000),
                                        ("70000", 70000), ("2k", 2000)])
def test_parameter_counts(text, count):
    assert parse_count(text) == count


@pytest.mark.parametrize("bad", ["7X", "", "-5", "0"])
def test_bad_parameter_counts(bad):
    with pytest.raises(HpcError):
        parse_count(bad)


def hpc(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "hpc", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=env)


def test_command_json_and_profile_defaults():
    proc = hpc("estimate-memory", "7B", "-p", "perlmutter", "-N", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["world_size"] == 8 and data["usable_gpu_memory_bytes"] == int(0.9 * 40 * 2**30)
            and data["fits"] == "zero1")
    assert [s["strategy"] for s in data["strategies"]] == list(STRATEGIES)


def test_command_table_names_the_cheapest_fit():
    proc = hpc("estimate-memory", "1.3B", "--world-size", "4", "--gpu-memory", "16G", "--strategy", "ddp",
               "--strategy", "zero2", "--strategy", "zero3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split() == ["strategy", "params", "grads", "optimizer", "activations", "total",
                                                   "host", "fits"]
    assert proc.stdout.strip().endswith("cheapest that fits 16G (keeping 10% free): zero2")


def test_command_counts_a_model_built_on_the_meta_device(tmp_path):
    (tmp_path / "mymodel.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(1000, 1000)\n")
    proc = hpc("estimate-memory", "mymodel:build", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["parameters"] == 1_001_000


@pytest.mark.parametrize("args", [["7X"], ["7B", "--strategy", "zero4"], ["7B", "--gpu-memory", "lots"],
                                  ["7B", "--batch-size", "4"], ["nosuchmodule:build"]])
def test_bad_input_is_one_line_and_exit_2(args):
    proc = hpc("estimate-memory", *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


# --- a local HuggingFace model folder and Accelerate's per-dtype table (--dtypes) ---------------------------------

OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1"}
# GPT-2 with a small vocabulary, so that a whole block (kept whole: GPT2Block is in _no_split_modules) is the
# largest layer, not the embedding and not the block's largest Linear
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100, "n_positions": 32,
        "bos_token_id": 0, "eos_token_id": 0}
# per block: ln_1 128 + c_attn 12,480 + attn c_proj 4,160 + ln_2 128 + c_fc 16,640 + mlp c_proj 16,448
BLOCK = 49_984
GPT2_PARAMS = 100 * 64 + 32 * 64 + 2 * BLOCK + 128  # wte, wpe, h.0, h.1, ln_f


@pytest.fixture
def gpt2_folder(tmp_path):
    folder = tmp_path / "tiny-gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT2))
    return folder


def run_in_process(*args):
    """The command in this process: transformers, once imported, is not imported again (seconds each time)."""
    from click.testing import CliRunner

    from hpc.cli.estimate_cmd import estimate_memory

    result = CliRunner().invoke(estimate_memory, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def real_model(folder):
    """What transformers builds for real, on the CPU, with its weights allocated."""
    import transformers

    return transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(folder, local_files_only=True))


def test_a_folder_is_counted_exactly_as_transformers_builds_it(gpt2_folder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = real_model(gpt2_folder)
    real_params = sum(p.numel() for p in model.parameters())
    assert real_params == GPT2_PARAMS
    size = measure(str(gpt2_folder))
    assert size.parameters == real_params
    assert size.total_bytes == sum(t.nbytes for t in [*model.parameters(), *model.buffers()]) == 4 * GPT2_PARAMS
    assert (size.largest_layer_bytes, size.largest_layers) == (4 * BLOCK, ["h.0", "h.1"])


def test_the_strategies_table_takes_a_folder(gpt2_folder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = json.loads(run_in_process(gpt2_folder, "--strategy", "ddp", "--json"))
    assert data["parameters"] == GPT2_PARAMS and data["strategies"][0]["state_bytes"] == 16 * GPT2_PARAMS


def test_dtypes_json_follows_accelerate(gpt2_folder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = json.loads(run_in_process(gpt2_folder, "--dtypes", "--json"))
    assert (data["parameters"], data["largest_layers"]) == (GPT2_PARAMS, ["h.0", "h.1"])
    total, layer = 4 * GPT2_PARAMS, 4 * BLOCK
    # Accelerate's training peak: float32 4x the fp32 size (the step), float16 2x (Adam's fp32 moments); no int
    keys = ("dtype", "largest_layer_bytes", "total_bytes", "training_adam_peak_bytes")
    assert data["dtypes"] == [dict(zip(keys, row)) for row in [
        ("float32", layer, total, 4 * total), ("float16", layer // 2, total // 2, 2 * total),
        ("int8", layer // 4, total // 4, None), ("int4", layer // 8, total // 8, None)]]


def test_dtypes_table_picks_the_dtypes_asked_for(gpt2_folder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lines = run_in_process(gpt2_folder, "--dtypes", "int4,float16", "--dtypes", "int4").splitlines()
    assert lines[1].split() == ["dtype", "largest", "layer", "total", "size", "training", "with", "Adam", "(peak)"]
    # 434,176 fp32 bytes; a block is 199,936
    assert [line.split() for line in lines[2:4]] == [["int4", "24.41", "KiB", "53.00", "KiB", "-"],
                                                     ["float16", "97.62", "KiB", "212.00", "KiB", "848.00", "KiB"]]
    assert lines[4] == "largest layer: h.0, h.1"


def test_a_bare_count_has_dtype_sizes_but_no_layers():
    proc = hpc("estimate-memory", "1B", "--dtypes", "float32", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["largest_layers"] is None and data["dtypes"] == [{
        "dtype": "float32", "largest_layer_bytes": None, "total_bytes": 4 * 10**9,
        "training_adam_peak_bytes": 16 * 10**9}]


def test_layers_are_leaves_and_integer_buffers_keep_their_size():
    import torch

    size = model_size(torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.BatchNorm1d(20)))
    # BatchNorm: weight, bias, running mean and var in fp32, and an int64 step count
    assert (size.parameters, size.total_bytes) == (220 + 40, (220 + 80) * 4 + 8)
    assert (size.largest_layer_bytes, size.largest_layers) == (880, ["0"])


PROBE_DTYPES = """
import runpy, sys
sys.argv = ["hpc", "estimate-memory", "7B", "--dtypes", "--json"]
try:
    runpy.run_module("hpc", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print("TORCH=" + str("torch" in sys.modules))
"""


def test_a_count_with_dtypes_imports_no_torch():
    proc = subprocess.run([sys.executable, "-c", PROBE_DTYPES], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "TORCH=False"


def test_missing_transformers_is_one_line_and_exit_2(gpt2_folder):
    hide = ("import sys; sys.modules['transformers'] = None; sys.argv = ['hpc'] + sys.argv[1:]; "
            "from hpc.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", hide, "estimate-memory", str(gpt2_folder), "--dtypes"],
                          capture_output=True, text=True, timeout=60, env=OFFLINE)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "needs transformers" in proc.stderr and "fix: pip install transformers" in proc.stderr


def test_a_config_transformers_cannot_build_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(HpcError, match="transformers cannot build a model from .*no-such-architecture") as e:
        measure(str(tmp_path))
    assert "\\n" not in str(e.value)  # transformers' message runs on for a paragraph: only its first line is kept


@pytest.mark.parametrize("args,says", [
    pytest.param(["{empty}"], "has no config.json", id="no config"),
    pytest.param(["someorg/somemodel", "--dtypes"], "is not a local folder", id="hub name"),
    pytest.param(["7B", "--dtypes", "bf16"], "dtype 'bf16' is not known", id="bad dtype"),
    pytest.param(["7B", "--dtypes", "-N", "4"], "--nodes is for the strategies table", id="strategy flag"),
])
def test_bad_model_or_dtypes_is_one_line_and_exit_2(tmp_path, args, says):
    (tmp_path / "empty").mkdir()
    proc = hpc("estimate-memory", *[a.format(empty=tmp_path / "empty") for a in args], env=OFFLINE)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr, proc.stderr


def test_a_profile_with_a_fast_tier_says_whether_it_fits_the_node_memory(tmp_path):
    """Checkpoints in node memory (issue 41): every rank's whole DDP state, times the copy of the previous node's,
    times the folders kept and the one being written, against the node memory the job has."""
    from click.testing import CliRunner

    from hpc.cli.estimate_cmd import estimate_memory

    profile = tmp_path / "fast.yaml"
    profile.write_text("name: fast\nextends: slurm-local\nmem: 8G\nfast_tier:\n  enabled: true\n")
    out = CliRunner().invoke(estimate_memory, ["125M", "-p", str(profile), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    ddp = next(s for s in data["strategies"] if s["strategy"] == "ddp")
    # slurm-local: 2 ranks a node; replicas 2; 3 folders
    # once a node (its first rank's folder; 2 ranks a node here), x 2 replicas x 3 folders (2 kept, 1 being written)
    assert data["fast_tier"]["bytes_per_node"] == (ddp["params"] + ddp["optimizer"]) * 2 * 3
    assert data["fast_tier"]["fits"] is False and data["fast_tier"]["node_memory_bytes"] == 8 * 2**30
    # FSDP: every rank writes its own shards (2 ranks a node), x 2 replicas x 3 folders
    fsdp = next(s for s in data["strategies"] if s["strategy"] == "fsdp")
    assert data["fast_tier"]["fsdp_bytes_per_node"] == (fsdp["params"] + fsdp["optimizer"]) * 2 * 2 * 3
    # DeepSpeed: every rank writes its partition and the module's state (ZeRO-2: whole weights), x 2 x 3 too
    zero2 = next(s for s in data["strategies"] if s["strategy"] == "zero2")
    assert data["fast_tier"]["deepspeed_bytes_per_node"]["zero2"] == (zero2["params"] + zero2["optimizer"]) * 2 * 2 * 3
    small = CliRunner().invoke(estimate_memory, ["10M", "-p", str(profile)])
    assert "GiB of node memory per node for ddp; with the host's share of the job it fits" in small.output
    assert "GiB for fsdp (every rank's shards)" in small.output
    assert "GiB for zero3 (every rank's files)" in small.output
