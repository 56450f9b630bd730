"""The memory estimator and its command: accounting per strategy, the cheapest fit, bad input."""

import json
import subprocess
import sys

import pytest

from hpc.errors import HpcError
from hpc.estimate import STRATEGIES, Shape, cheapest_fit, estimate, parse_count

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


def hpc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hpc", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_command_json_and_profile_defaults():
    proc = hpc("estimate-memory", "7B", "-p", "perlmutter", "-N", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["world_size"] == 8 and data["usable_gpu_memory_bytes"] == int(0.9 * 40 * 2**30) and data["fits"] == "zero1"
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
