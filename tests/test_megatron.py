"""Megatron-LM's layout on 4 CPU ranks (gloo): the training loop of transformers' run_clm_no_trainer.py with the
edits of Accelerate's Megatron-LM page (tests/megatron_worker.py), launched the way Accelerate launches it
(`--use_megatron_lm --megatron_lm_*`), on a small 4-block Llama. Every layout takes the same global batch as plain
data parallelism and gives its per-step training and evaluation losses; each rank holds its share of parameters and
optimizer state; a checkpoint resumes under its own layout with the same losses and loads under another with the
same weights (DCP)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.jobhelpers import launch_env

WORKER = Path(__file__).parent / "megatron_worker.py"
STEPS, SAVE_AT = 4, 2
LAYOUTS = {
    "plain": (1, []),  # one process taking the whole global batch: plain data parallelism's losses
    "tp2 x pp2 (sp)": (4, ["--megatron_lm_tp_degree", "2", "--megatron_lm_pp_degree", "2",
                           "--megatron_lm_num_micro_batches", "2", "--megatron_lm_sequence_parallelism", "true"]),
    "tp2 x dp2": (4, ["--megatron_lm_tp_degree", "2", "--megatron_lm_use_distributed_optimizer", "true",
                      "--megatron_lm_recompute_activations", "true", "--megatron_lm_sequence_parallelism", "true"]),
    "pp2 x dp2": (4, ["--megatron_lm_pp_degree", "2", "--megatron_lm_num_micro_batches", "2",
                      "--megatron_lm_use_distributed_optimizer", "true", "--megatron_lm_pipeline_schedule", "gpipe"]),
}
CLIP = "0.05"  # far below the gradients' norm: clipping changes every step


def _launch(folder: Path, nproc: int, flags: list, spec: dict) -> dict:
    spec = {"project": str(folder / "project"), "global_batch": 8, "steps": STEPS, "out": str(folder / "out.pt"),
            **spec}
    plain = not flags or flags[0] == "--use_fsdp"
    layout = flags if plain else ["--use_megatron_lm", *flags, "--megatron_lm_gradient_clipping", CLIP]
    cmd = [sys.executable, "-m", "hpc", "launch", "--nproc", str(nproc), *layout, str(WORKER), json.dumps(spec)]
    done = subprocess.run(cmd, cwd=folder, env=launch_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(spec["out"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out, saved = {}, tmp_path_factory.mktemp("tp2pp2") / "saved"
    for name, (nproc, flags) in LAYOUTS.items():
        folder = tmp_path_factory.mktemp(name.replace(" ", "")[:8])
        spec = {"clip": float(CLIP)} if not flags else {}
        if name == "tp2 x pp2 (sp)":
            spec |= {"save": str(saved), "save_at": SAVE_AT, "generate": 5}
        if name == "pp2 x dp2":
            spec |= {"load": str(saved)}
        out[name] = _launch(folder, nproc, flags, spec)
    # plain FSDP (no Megatron layout) on 2 ranks, loading the tp2 x pp2 checkpoint: DCP reshards it
    out["fsdp"] = _launch(tmp_path_factory.mktemp("fsdp"), 2, ["--use_fsdp"],
                          {"clip": float(CLIP), "load": str(saved), "steps": 1})
    out["saved folder"] = saved
    return out


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "plain"])
def test_each_layout_trains_and_evaluates_as_plain_data_parallelism(runs, name):
    plain, run = runs["plain"], runs[name]
    assert run["distributed_type"] == "MEGATRON_LM" and run["global_batch"] == 8
    assert len(run["losses"]) == STEPS
    torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(plain["losses"]), rtol=1e-4, atol=0)
    torch.testing.assert_close(torch.tensor(run["eval"]), torch.tensor(plain["eval"]), rtol=1e-4, atol=0)
    # MegatronLMDummyScheduler: the learning rate the non-Megatron branch's linear schedule gives
    assert run["lr"] == pytest.approx(plain["lr"])
    # Adam divides each gradient by its own running size: where a gradient is near zero (a rarely seen token's
    # embedding row) the sums' order, which tensor parallelism changes, moves the step by up to ~3e-5
    for key, value in plain["weights"].items():
        torch.testing.assert_close(run["weights"][key], value, rtol=1e-3, atol=1e-4)


# the share of parameters (and Adam's two states for each) a rank may hold in each layout: tp and pp cut the model,
# the distributed optimizer shards what they leave over the data-parallel ranks
SHARE = {"tp2 x pp2 (sp)": 4, "tp2 x dp2": 4, "pp2 x dp2": 4}


@pytest.mark.parametrize("name", list(SHARE))
def test_each_rank_holds_about_its_share_of_parameters_and_optimizer_state(runs, name):
    run = runs[name]
    total = run["total"]
    params, state = run["held"][0::2], run["held"][1::2]
    assert sum(params) >= total, params
    assert max(params) < total / SHARE[name] * 1.25, params
    assert max(state) < 2 * total / SHARE[name] * 1.25, state


def test_a_checkpoint_resumes_under_its_layout_with_the_same_losses(runs):
    run = runs["tp2 x pp2 (sp)"]
    torch.testing.assert_close(torch.tensor(run["resumed"]), torch.tensor(run["losses"][SAVE_AT:]), rtol=1e-5,
                               atol=0)


@pytest.mark.parametrize("name", ["pp2 x dp2", "fsdp"])
def test_a_checkpoint_loads_under_another_layout_with_equal_weights(runs, name):
    saved, loaded = runs["tp2 x pp2 (sp)"]["saved_weights"], runs[name]["loaded_weights"]
    assert saved.keys() == loaded.keys()
    for key, value in saved.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)


def test_merge_weights_writes_a_tp2_x_pp2_checkpoint_as_one_file_of_the_whole_model(runs, tmp_path):
    from safetensors.torch import load_file

    merged = subprocess.run([sys.executable, "-m", "hpc", "merge-weights", str(runs["saved folder"]), "-o",
                             str(tmp_path / "model.safetensors")], cwd=tmp_path, env=launch_env(),
                            capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    weights, saved = load_file(tmp_path / "model.safetensors"), runs["tp2 x pp2 (sp)"]["saved_weights"]
    assert weights.keys() == saved.keys()  # every stage's and every tensor-parallel shard's, under the model's names
    for key, value in saved.items():
        assert torch.equal(weights[key], value), key


def test_megatron_generate_decodes_as_transformers_generate_on_the_same_weights(runs):
    import transformers

    run = runs["tp2 x pp2 (sp)"]
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    model.load_state_dict(run["weights"])
    expected = model.generate(run["prompt"], max_new_tokens=4, do_sample=False,
                              attention_mask=torch.ones_like(run["prompt"]))
    assert torch.equal(run["generated"], expected)
    # as Accelerate's under Megatron-LM: the script's main process is the last rank, where the loss is
    assert run["main"] == [False, False, False, True]


# GPT-2, the seed's model: learned positions and a head tied to the embeddings. Its fused q/k/v attention is not cut
# by tensor parallelism (refused in one line); a pipeline keeps the tied weight on the first and the last stage and
# sums their gradients, so both take the same steps as the one tied weight of plain data parallelism.
GPT2_PP = ["--megatron_lm_pp_degree", "2", "--megatron_lm_num_micro_batches", "2",
           "--megatron_lm_use_distributed_optimizer", "true"]


@pytest.fixture(scope="module")
def gpt2_runs(tmp_path_factory):
    saved = tmp_path_factory.mktemp("gpt2-saved") / "saved"
    out = {"plain": _launch(tmp_path_factory.mktemp("gpt2-plain"), 1, [], {"model": "gpt2", "clip": float(CLIP)}),
           "pp2 x dp2": _launch(tmp_path_factory.mktemp("gpt2-pp2dp2"), 4, GPT2_PP,
                                {"model": "gpt2", "save": str(saved), "save_at": SAVE_AT})}
    out["fsdp"] = _launch(tmp_path_factory.mktemp("gpt2-fsdp"), 2, ["--use_fsdp"],
                          {"model": "gpt2", "clip": float(CLIP), "load": str(saved), "steps": 1})
    return out


def test_gpt2_under_a_pipeline_trains_evaluates_and_resumes_as_plain_data_parallelism(gpt2_runs):
    plain, piped = gpt2_runs["plain"], gpt2_runs["pp2 x dp2"]
    assert torch.allclose(torch.tensor(piped["losses"]), torch.tensor(plain["losses"]), rtol=1e-4, atol=0), (
        piped["losses"], plain["losses"])
    assert piped["eval"] == pytest.approx(plain["eval"], rel=1e-4)
    # the tied weight: the first stage's embedding and the last stage's head took the same steps
    assert torch.allclose(piped["weights"]["transformer.wte.weight"], piped["weights"]["lm_head.weight"])
    for name, weight in piped["weights"].items():
        assert torch.allclose(weight, plain["weights"][name], rtol=1e-3, atol=1e-5), name
    assert piped["resumed"] == pytest.approx(piped["losses"][SAVE_AT:], rel=1e-5)


def test_gpt2s_pipeline_checkpoint_loads_under_plain_fsdp_with_equal_weights(gpt2_runs):
    saved, loaded = gpt2_runs["pp2 x dp2"]["saved_weights"], gpt2_runs["fsdp"]["loaded_weights"]
    for name in saved:
        assert torch.allclose(loaded[name], saved[name]), name


def test_gpt2_with_tensor_parallelism_is_refused_in_one_line(tmp_path):
    spec = {"project": str(tmp_path / "p"), "global_batch": 8, "steps": 1, "out": str(tmp_path / "out.pt"),
            "model": "gpt2"}
    done = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", "--use_megatron_lm",
                           "--megatron_lm_tp_degree", "2", str(WORKER), json.dumps(spec)], cwd=tmp_path,
                          env=launch_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "attention is one fused q/k/v layer, which hpc does not cut by heads" in done.stderr, done.stderr[-2000:]
