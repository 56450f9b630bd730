"""Megatron-LM's layout on 4 CPU ranks (gloo): the training loop of transformers' run_clm_no_trainer.py with the
edits of Accelerate's Megatron-LM page (tests/megatron_worker.py), launched the way Accelerate launches it
(`--use_megatron_lm --megatron_lm_*`), on a small 4-block Llama and a small 4-block GPT-2. Every layout takes the
same global batch as plain data parallelism and gives its per-step training and evaluation losses; each rank holds
its share of parameters and optimizer state; a checkpoint resumes under its own layout with the same losses and
loads under another with the same weights (DCP). Each of torch's pipeline schedules runs in one layout: 1F1B and
interleaved 1F1B (Llama), looped BFS and GPipe (GPT-2)."""

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
    # Megatron-LM's interleaving: a block a virtual stage, two on each pipeline rank (ranks 0 1 0 1)
    "pp2 x dp2": (4, ["--megatron_lm_pp_degree", "2", "--megatron_lm_num_micro_batches", "2",
                      "--megatron_lm_use_distributed_optimizer", "true",
                      "--megatron_lm_num_layers_per_virtual_pipeline_stage", "1"]),
}
# the schedule of torch.distributed.pipelining each layout ran
SCHEDULE = {"tp2 x pp2 (sp)": "Schedule1F1B", "pp2 x dp2": "ScheduleInterleaved1F1B"}
# tensor parallelism beside the distributed optimizer (FSDP2 over the data ranks), recomputed blocks and sequence
# parallelism: GPT-2's layout below (its own plan differs from Llama's in the attention only, which tp2 x pp2 runs)
TP2_DP2 = ["--megatron_lm_tp_degree", "2", "--megatron_lm_use_distributed_optimizer", "true",
           "--megatron_lm_recompute_activations", "true", "--megatron_lm_sequence_parallelism", "true"]
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
    assert run["schedule"] == SCHEDULE[name]
    assert len(run["losses"]) == STEPS
    torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(plain["losses"]), rtol=1e-4, atol=0)
    torch.testing.assert_close(torch.tensor(run["eval"]), torch.tensor(plain["eval"]), rtol=1e-4, atol=0)
    # MegatronLMDummyScheduler: the learning rate the non-Megatron branch's linear schedule gives
    assert run["lr"] == pytest.approx(plain["lr"])
    # Adam divides each gradient by its own running size: where a gradient is near zero (a rarely seen token's
    # embedding row) the sums' order, which tensor parallelism changes, moves the step by up to ~3e-5
    for key, value in plain["weights"].items():
        torch.testing.assert_close(run["weights"][key], value, rtol=1e-3, atol=1e-4)


# Llama's layouts whose ranks' shares of parameters and optimizer state are checked (with GPT-2's, at the end)
SHARE = ("tp2 x pp2 (sp)", "pp2 x dp2")


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


# GPT-2, the seed's model: learned positions, one fused q/k/v layer, a head tied to the embeddings. Tensor
# parallelism cuts the fused layer by heads (its columns held in rank-major order, shown to checkpoints in the
# model's own: conv1d_parallel, column_blocks); a pipeline keeps the tied weight on the first and the last stage and
# sums their gradients, so both take the same steps as the one tied weight of plain data parallelism.
GPT2_LAYOUTS = {
    # looped BFS over two virtual stages a rank, with tensor and sequence parallelism and the tied head
    "tp2 x pp2 (sp)": [*LAYOUTS["tp2 x pp2 (sp)"][1], "--megatron_lm_pipeline_schedule", "looped_bfs"],
    "tp2 x dp2": TP2_DP2,
    "pp2 x dp2": ["--megatron_lm_pp_degree", "2", "--megatron_lm_num_micro_batches", "2",
                  "--megatron_lm_use_distributed_optimizer", "true", "--megatron_lm_pipeline_schedule", "gpipe"],
}
GPT2_SCHEDULE = {"tp2 x pp2 (sp)": "ScheduleLoopedBFS", "tp2 x dp2": None, "pp2 x dp2": "ScheduleGPipe"}


@pytest.fixture(scope="module")
def gpt2_runs(tmp_path_factory):
    saved = tmp_path_factory.mktemp("gpt2-saved") / "saved"
    out = {"plain": _launch(tmp_path_factory.mktemp("gpt2-plain"), 1, [], {"model": "gpt2", "clip": float(CLIP)})}
    for name, flags in GPT2_LAYOUTS.items():
        spec = {"model": "gpt2"}
        if name == "tp2 x pp2 (sp)":  # writes the checkpoint the other layouts read
            spec |= {"save": str(saved), "save_at": SAVE_AT, "generate": 5}
        else:
            spec |= {"load": str(saved), "save_at": SAVE_AT, "load_resume": True}
        out[name] = _launch(tmp_path_factory.mktemp("gpt2-" + name.replace(" ", "")[:8]), 4, flags, spec)
    return out


@pytest.mark.parametrize("name", list(GPT2_LAYOUTS))
def test_gpt2_trains_and_evaluates_as_plain_data_parallelism_in_each_layout(gpt2_runs, name):
    plain, run = gpt2_runs["plain"], gpt2_runs[name]
    assert run["schedule"] == GPT2_SCHEDULE[name]
    torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(plain["losses"]), rtol=1e-4, atol=0)
    assert run["eval"] == pytest.approx(plain["eval"], rel=1e-4)
    if "pp2" in name:  # the tied weight: the first stage's embedding and the last stage's head took the same steps
        assert torch.allclose(run["weights"]["transformer.wte.weight"], run["weights"]["lm_head.weight"])
    for key, weight in run["weights"].items():
        torch.testing.assert_close(weight, plain["weights"][key], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", ["tp2 x dp2", "pp2 x dp2"])
def test_gpt2s_optimizer_state_crosses_layouts_losses_go_on_as_uninterrupted(gpt2_runs, name):
    # another layout (its moments sharded by FSDP too; pp2 x dp2 holds the fused layer whole, in the model's order)
    # trains on from tp2 x pp2's step-2 checkpoint: Adam's moments of the fused layer came across in the model's
    # order, so the steps after go as the uninterrupted plain run's
    torch.testing.assert_close(torch.tensor(gpt2_runs[name]["load_resumed"]),
                               torch.tensor(gpt2_runs["plain"]["losses"][SAVE_AT:]), rtol=1e-4, atol=0)


def test_gpt2_megatron_generate_decodes_as_transformers_generate(gpt2_runs):
    import transformers

    run = gpt2_runs["tp2 x pp2 (sp)"]
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=32, n_layer=4, n_head=4, vocab_size=128, n_positions=64)).eval()
    model.load_state_dict(run["weights"])
    expected = model.generate(run["prompt"], max_new_tokens=4, do_sample=False,
                              attention_mask=torch.ones_like(run["prompt"]), pad_token_id=0)
    assert torch.equal(run["generated"], expected)


# --- both models' runs ---------------------------------------------------------------------------------------------
# (the fixture, the layout): the tp and pp layouts cut the model in 4, the distributed optimizer shards what they leave
SHARES = [("runs", name) for name in SHARE] + [("gpt2_runs", name) for name in GPT2_LAYOUTS]


@pytest.mark.parametrize("runs_of,name", SHARES)
def test_each_rank_holds_about_its_share_of_parameters_and_optimizer_state(request, runs_of, name):
    run = request.getfixturevalue(runs_of)[name]
    # a tied head is the embedding's weight: one parameter under two names
    tied = run["weights"]["lm_head.weight"].numel() if runs_of == "gpt2_runs" else 0
    total = run["total"] - tied
    params, state = run["held"][0::2], run["held"][1::2]
    assert sum(params) >= total, params
    assert max(params) < total / 4 * 1.25, params
    assert max(state) < 2 * total / 4 * 1.25, state


@pytest.mark.parametrize("runs_of", ["runs", "gpt2_runs"])
def test_a_tp2_x_pp2_checkpoint_resumes_under_its_layout_with_the_same_losses(request, runs_of):
    run = request.getfixturevalue(runs_of)["tp2 x pp2 (sp)"]
    torch.testing.assert_close(torch.tensor(run["resumed"]), torch.tensor(run["losses"][SAVE_AT:]), rtol=1e-5,
                               atol=0)


@pytest.mark.parametrize("runs_of,name", [("runs", "pp2 x dp2"), ("runs", "fsdp"), ("gpt2_runs", "tp2 x dp2"),
                                          ("gpt2_runs", "pp2 x dp2")])
def test_a_tp2_x_pp2_checkpoint_loads_under_another_layout_with_equal_weights(request, runs_of, name):
    runs = request.getfixturevalue(runs_of)
    saved, loaded = runs["tp2 x pp2 (sp)"]["saved_weights"], runs[name]["loaded_weights"]
    assert saved.keys() == loaded.keys()
    for key in saved:  # GPT-2's fused q/k/v columns in the model's order, whichever layout wrote or reads them
        assert torch.equal(loaded[key], saved[key]), key
