"""prepare_pippy on 2 real ranks (gloo, CPU): one stage per rank, the pipelined output equal to the whole model's
on the same inputs (num_chunks 1 and 2, split points named and "auto", on the last rank or gathered on all), a short
batch padded and cut back, calls it cannot take refused on every rank alike, and a tiny GPT-2 from transformers.
Quick one-process checks are in tests/unit/test_pipeline_inference.py."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent("""
    import json, sys
    import torch
    from hpc.errors import HpcError
    from hpc.runtime.inference.pipeline import prepare_pippy
    from hpc.runtime.process.state import PartialState

    rank, out = PartialState().process_index, {}

    def mlp():
        torch.manual_seed(0)  # the same weights on every rank: one rank's whole model is the reference
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                   torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()

    def compare(got, want):  # None where the rank holds no output
        return None if got is None else bool(got.shape == want.shape and torch.allclose(got, want, atol=1e-6))

    def refusal(call):
        try:
            call()
            return "ran"
        except HpcError as e:
            return str(e)

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    want = mlp()(x).detach()
    for split, chunks, gather in ((["2"], 1, False), (["2"], 2, True), ("auto", 2, False), ("auto", 1, True)):
        model = prepare_pippy(mlp(), split_points=split, example_args=(x[:4 // chunks],), num_chunks=chunks,
                              gather_output=gather)
        out[f"{split}-{chunks}-{gather}"] = {"same": compare(model(x), want), "split": model.hf_split_points}

    # the last one (auto, one chunk of 4 rows, gathered) again: short, long and odd calls
    out["short"] = compare(model(x[:3]), want[:3])
    out["long"] = refusal(lambda: model(torch.randn(5, 8)))
    out["wide"] = refusal(lambda: model(torch.randn(4, 9)))
    out["dtype"] = refusal(lambda: model(x.double()))
    out["keyword"] = refusal(lambda: model(input=x))
    out["after_refusals"] = compare(model(x), want)
    out["own_forward"] = compare(model._original_forward(x).detach(), want)
    out["split_module_forward_restored"] = "forward" not in vars(model[2]) and "_orig_forward" not in vars(model[2])
    out["twice"] = refusal(lambda: prepare_pippy(model, example_args=(x,)))
    out["too_many_splits"] = refusal(lambda: prepare_pippy(mlp(), split_points=["2", "4"], example_args=(x,)))

    class TwoHeads(torch.nn.Module):  # returns a dict: the pipeline gives it back as one, not as bare tensors
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body, self.head = mlp(), torch.nn.Linear(4, 3)

        def forward(self, x):
            scores = self.head(self.body(x))
            return {"scores": scores, "probs": scores.softmax(-1)}

    want_heads = TwoHeads().eval()(x)
    got = prepare_pippy(TwoHeads().eval(), split_points=["head"], example_args=(x[:2],), gather_output=True)(x[:3])
    out["dict_output"] = {key: compare(value, want_heads[key][:3]) for key, value in got.items()}

    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, use_cache=False,
                        bos_token_id=1, eos_token_id=1, pad_token_id=0)

    def gpt2(cls):
        torch.manual_seed(0)
        return cls(config).eval()

    ids = torch.randint(1, 64, (4, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want_logits = gpt2(GPT2LMHeadModel)(input_ids=ids).logits
    model = prepare_pippy(gpt2(GPT2LMHeadModel), example_kwargs={"input_ids": ids[:2]})
    got = model(input_ids=ids)
    same = None if got is None else compare(got.logits, want_logits) and torch.equal(got[0], got.logits)
    out["gpt2"] = {"same": same, "type": type(got).__name__, "split": model.hf_split_points}
    # Accelerate's own test model: its head reads input_ids, which torch gives to the first stage only
    out["gpt2_sequence_classifier"] = refusal(lambda: prepare_pippy(gpt2(GPT2ForSequenceClassification),
                                                                    example_args=(ids[:2],)))
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
        json.dump(out, f)
""")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Both ranks' results, [rank 0's, rank 1's]: one `hpc launch` for the file (each start costs two torch
    imports, and transformers', on a 2-core machine)."""
    tmp = tmp_path_factory.mktemp("pippy")
    (tmp / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "ACCELERATE_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp / "hf"))  # the GPT-2 is built from a config: no download
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", "worker.py", str(tmp)], cwd=tmp,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize("case", ["['2']-1-False", "['2']-2-True", "auto-2-False", "auto-1-True"])
def test_the_pipelined_output_equals_the_whole_models(ranks, case):
    first, last = ranks[0][case], ranks[1][case]
    assert last["same"] is True
    gathered = case.endswith("True")
    assert first["same"] is (True if gathered else None)  # elsewhere than the last rank: only when gathered


def test_auto_puts_the_cut_between_two_halves_of_the_weights(ranks):
    # Linear(8,16), ReLU, Linear(16,16), ReLU, Linear(16,4): the big middle layer begins stage 1; "1" (the ReLU)
    # would cut at the same weights, but an activation stays with the layer before it
    assert all(rank[case]["split"] == ["2"] for rank in ranks for case in ("auto-2-False", "auto-1-True"))
    assert ranks[0]["['2']-1-False"]["split"] == ["2"]


def test_a_short_batch_is_padded_and_its_output_cut_back(ranks):
    assert [rank["short"] for rank in ranks] == [True, True]


def test_a_call_the_pipeline_cannot_take_is_refused_on_every_rank_alike(ranks):
    first, last = ranks
    for key in ("long", "wide", "dtype", "keyword"):
        assert first[key] == last[key] != "ran", key  # the same one line everywhere, and no rank left waiting
    assert "the call has [5] rows; this pipeline takes 1 to 4 per call" in first["long"]
    assert "fix: split the batch into pieces of at most 4 rows" in first["long"]
    assert "argument 0 is torch.float32 of shape (4, 9), traced as torch.float32 of shape (4, 8)" in first["wide"]
    assert "torch.float64" in first["dtype"] and "fix: keep each input's dtype" in first["dtype"]
    assert "laid out unlike example_args" in first["keyword"]
    assert [rank["after_refusals"] for rank in ranks] == [True, True]  # the pipeline still works afterwards


def test_the_models_own_forward_is_kept(ranks):
    assert all(rank["own_forward"] and rank["split_module_forward_restored"] for rank in ranks)
    assert all(rank["twice"].startswith("prepare_pippy: this model is prepared already; fix: ") for rank in ranks)


def test_split_points_must_make_one_stage_per_rank(ranks):
    assert all(rank["too_many_splits"] == "prepare_pippy: 2 split points make 3 stages, but this job has 2 ranks "
               "(one stage each); fix: give 1 split point, or split_points='auto'" for rank in ranks)


def test_the_output_comes_back_in_the_models_own_type(ranks):
    """torch's pipeline hands over the last stage's tensors bare; the caller gets what the model returns (a dict
    here, a transformers ModelOutput below), padded rows cut off, on every rank when gathered."""
    assert [rank["dict_output"] for rank in ranks] == [{"scores": True, "probs": True}] * 2


def test_a_tiny_gpt2_runs_pipelined_with_keyword_inputs(ranks):
    assert [rank["gpt2"]["same"] for rank in ranks] == [None, True]
    assert [rank["gpt2"]["type"] for rank in ranks] == ["NoneType", "CausalLMOutputWithCrossAttentions"]
    assert ranks[1]["gpt2"]["split"] == ["transformer.h.1"]  # auto: one block per rank


def test_a_later_stage_reading_a_model_input_is_refused_when_prepared(ranks):
    message = ranks[0]["gpt2_sequence_classifier"]
    assert message == ranks[1]["gpt2_sequence_classifier"]
    assert "stage 1 (from 'transformer.h.1' on) reads the model's input 'input_ids'" in message
    assert "fix: choose split points after which no layer reads a model input" in message
