"""Accelerate's examples/inference scripts that fit a CPU, run under hpc with only their imports changed (and the
hub model ids, CUDA device numbers and phi2.py's device_map, each marked `# was: ...`): copies in
scripts/accelerate_inference_examples/, tiny models made here from transformers configs (2 layers, hidden 32, a
WordLevel tokenizer), no hub. Each runs the way its README says, in one `hpc launch` (2 ranks, gloo), all launches
at once (t5.py, which stops in its first lines, in this process); its outputs are compared with what the same tiny
model gives undispatched in this process.

Not here (see the folder's README.md): distributed/stable_diffusion.py and distributed_image_generation.py
(diffusers), florence2.py and llava_next_video.py (hub-only processors, remote code, flash_attn, av),
distributed_speech_generation.py (fire, scipy and a hub data set)."""

import contextlib
import os
import runpy
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

EXAMPLES = Path(__file__).resolve().parents[1] / "scripts" / "accelerate_inference_examples"
SCRIPTS = ("phi2", "bert", "gpt2", "llama", "t5")
LAUNCHED = ("phi2", "bert", "gpt2", "llama")  # t5.py stops in its first lines: run here (see its test)

# Runs each example's text as __main__ in turn, in one pair of ranks (each rank's torch and transformers imports
# are most of the time, on 2 cores), and keeps, per example and rank, the names its outputs are in (also when it
# fails: an example's own last lines may fail after the model ran), with the error it ended with.
RUNNER = textwrap.dedent("""
    import os, sys, traceback
    from collections.abc import Mapping
    import torch

    out = sys.argv[1]
    for script in sys.argv[2:]:
        names = {"__name__": "__main__", "__file__": script}
        error = None
        try:
            exec(compile(open(script).read(), script, "exec"), names)
        except BaseException as e:
            error = "".join(traceback.format_exception_only(e)).strip()
        kept = {name: names.get(name) for name in ("completions", "outputs", "output", "input", "inputs")}
        kept = {name: dict(value) if isinstance(value, Mapping) else value for name, value in kept.items()}
        name = os.path.basename(script)[:-3]
        torch.save({**kept, "error": error}, f"{out}/{name}-rank{os.environ['RANK']}.pt")
        if not torch.distributed.is_initialized():  # the example ended with destroy_process_group(): the next
            from hpc import PartialState           # one starts its own, as a new launch would, on a port of its
            PartialState._reset_state()            # own (a rank quick to start it could reach the other rank's
            os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)  # store of the group ending)
""")

WORDS = ("I would like to hello how are you what is going on roses red and welcome the hotel really The weather "
         "pretty").split()


def _tokenizer():
    """A word-level tokenizer over the examples' prompts: every id decodes to a word of its own."""
    vocab = {word: i for i, word in enumerate(["<pad>", "<unk>", "<eos>", *sorted(set(WORDS))])}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>", eos_token="<eos>")


def _save_tiny_models(folder: Path) -> None:
    """Under the names the example copies load ("tiny-phi", ...): tiny sizes, but the configs' other settings as
    the real models' (use_cache on, BERT's 512 and GPT-2's 1024 positions, which the examples fill)."""
    tokenizer = _tokenizer()
    small = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, max_position_embeddings=64)
    ids = dict(pad_token_id=0, bos_token_id=2, eos_token_id=2)
    models = {"tiny-phi": transformers.PhiForCausalLM(transformers.PhiConfig(**small, **ids)),
              "tiny-llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, **ids)),
              "tiny-bert": transformers.BertForMaskedLM(transformers.BertConfig(**{**small,
                                                                                  "max_position_embeddings": 512})),
              "tiny-gpt2": transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
                  vocab_size=len(tokenizer), n_positions=1024, n_embd=32, n_layer=2, n_head=2, **ids))}
    for name, model in models.items():
        model.save_pretrained(folder / name)
        if name in ("tiny-phi", "tiny-llama"):
            tokenizer.save_pretrained(folder / name)


@contextlib.contextmanager
def _one_thread():
    """As each of 2 ranks on this machine runs (OMP_NUM_THREADS=1): the same sums in the same order."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{script: (returncode, output, [rank 0's kept names, rank 1's])}: the examples one after the other in one
    `hpc launch` of 2 ranks, the tiny models made first (the launch's return code and output are shared; each
    example's own end is its ranks' "error")."""
    tmp = tmp_path_factory.mktemp("accelerate-inference")
    torch.manual_seed(0)
    _save_tiny_models(tmp)
    (tmp / "runner.py").write_text(RUNNER)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "ACCELERATE_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp / "hf"), TRANSFORMERS_VERBOSITY="error")
    (tmp / "out").mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "hpc", "launch", "--nproc", "2", "runner.py", str(tmp / "out"),
                             *[str(EXAMPLES / f"{name}.py") for name in LAUNCHED]], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output = proc.communicate(timeout=180)[0]
    except subprocess.TimeoutExpired:  # the ranks too, not only the launcher: nothing left running
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0] + "\n[killed after 180 s]"
    results = {}
    for name in LAUNCHED:
        ranks = [torch.load(tmp / "out" / f"{name}-rank{rank}.pt", weights_only=True)
                 if (tmp / "out" / f"{name}-rank{rank}.pt").exists() else None for rank in (0, 1)]
        results[name] = (proc.returncode, output, ranks)
    results["folder"] = tmp
    return results


def _model(runs, cls, name, **kwargs):
    return getattr(transformers, cls).from_pretrained(runs["folder"] / name, **kwargs).eval()


def test_phi2_completions_equal_the_undispatched_models(runs):
    """distributed/phi2.py: the prompts split over 2 ranks (the last batch repeated for the second rank), each
    generates 20 tokens greedily in float16, the strings gathered on every rank and printed by the first."""
    returncode, output, ranks = runs["phi2"]
    assert None not in ranks and not any(rank["error"] for rank in ranks), output[-3000:]
    model = _model(runs, "AutoModelForCausalLM", "tiny-phi", dtype=torch.float16)
    tokenizer = transformers.AutoTokenizer.from_pretrained(runs["folder"] / "tiny-phi")
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.eos_token, "left"
    prompts = ["I would like to", "hello how are you", "what is going on", "roses are red and", "welcome to the hotel"]
    want, ids = [], []
    with _one_thread():
        for start in range(0, len(prompts), 2):
            batch = tokenizer(prompts[start:start + 2], padding=True, pad_to_multiple_of=8, return_tensors="pt")
            ids.append(model.generate(**batch, max_new_tokens=20))
            want += tokenizer.batch_decode(ids[-1], skip_special_tokens=True)
    assert all(len(text.split()) > len(prompt.split()) for text, prompt in zip(want, prompts))  # it did generate
    assert [rank["completions"] for rank in ranks] == [want, want]
    assert str(want) in output  # distributed_state.print: the first rank's line
    # each rank's last generate call, in token ids: the first rank's second batch, the second rank's third
    assert torch.equal(ranks[0]["outputs"], ids[1]) and torch.equal(ranks[1]["outputs"], ids[2])


def test_bert_pipelined_logits_equal_the_undispatched_models(runs):
    """pippy/bert.py: traced on one row of 512 tokens, split "auto" over 2 ranks, then called 6 times on 2 rows
    (one microbatch per rank); the output on the last rank only, as the model's MaskedLMOutput, whose output[0] the
    example stacks back into the logits. The expanded attention mask crosses the split."""
    returncode, output, (first, last) = runs["bert"]
    assert first is not None and last is not None and not first["error"] and not last["error"], output[-3000:]
    assert "Average time per batch" in output
    assert first["output"] is None and torch.equal(first["input"], last["input"])
    with torch.no_grad(), _one_thread():
        want = _model(runs, "AutoModelForMaskedLM", "tiny-bert")(last["input"]).logits
    assert last["input"].shape == (2, 512)
    assert last["output"].shape == want.shape and torch.allclose(last["output"], want, atol=1e-5)


def test_gpt2_sequence_classifier_is_refused_when_prepared(runs):
    """pippy/gpt2.py: GPT2ForSequenceClassification's head reads input_ids (to find each row's last token), and
    torch gives the model's inputs to the first stage only: refused on every rank in one line, before any call
    (docs/inference.md)."""
    returncode, output, ranks = runs["gpt2"]
    assert None not in ranks, output[-3000:]
    for rank in ranks:
        assert rank["error"].startswith("hpc.errors.HpcError: prepare_pippy: stage 1 (from 'transformer.h.")
        assert "reads the model's input 'input_ids' itself" in rank["error"]
        assert "fix: choose split points after which no layer reads a model input" in rank["error"]


def test_llama_runs_to_its_end_with_the_pipelined_logits_equal_the_undispatched_models(runs):
    """pippy/llama.py: traced on 2 prompts given as the tokenizer's BatchEncoding, called on 3 (a short batch:
    padded to 4 and cut back); the config's use_cache is on, as Llama-2's is. The output is the model's
    CausalLMOutputWithPast, so the example's last lines (output[0][:, -1, :], the next token) run too."""
    returncode, output, (first, last) = runs["llama"]
    assert first is not None and last is not None and not first["error"] and not last["error"], output[-3000:]
    assert first["output"] is None and list(last["output"]) == ["logits"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(runs["folder"] / "tiny-llama")
    tokenizer.pad_token = tokenizer.eos_token
    inputs = tokenizer(("I would like to", "I really like to", "The weather is pretty"), return_tensors="pt",
                       padding=True)
    assert all(torch.equal(last["inputs"][key], inputs[key]) for key in inputs)
    with torch.no_grad(), _one_thread():
        want = _model(runs, "AutoModelForCausalLM", "tiny-llama", attn_implementation="sdpa")(**inputs).logits
    assert last["output"]["logits"].shape == want.shape == (3, 4, len(_tokenizer()))
    assert torch.allclose(last["output"]["logits"], want, atol=1e-5)
    assert str(tokenizer.batch_decode(want[:, -1, :].argmax(-1))) in output  # its last line's print


def test_t5_stops_where_accelerate_stops():
    """pippy/t5.py refuses itself for accelerate>0.33 (encoder-decoder models need the old torchpippy), in its
    first lines, before any model or process group; hpc's __version__ is the Accelerate API level it implements
    (1.15.0+hpc...), so it stops there as under Accelerate. Run in this process, as `python t5.py` would: a launch
    would only cost two more torch imports."""
    with pytest.raises(RuntimeError, match=r"^Using encoder/decoder models is not supported with the "
                       r"`torch\.pipelining` integration or accelerate>=0\.34\.0"):
        runpy.run_path(str(EXAMPLES / "t5.py"), run_name="__main__")


def test_the_copies_change_only_marked_lines():
    """Each copy keeps Accelerate's license header; every line that differs from Accelerate's names what it was."""
    for name in SCRIPTS:
        text = (EXAMPLES / f"{name}.py").read_text()
        assert text.startswith("# Copyright 2024 The HuggingFace Inc. team. All rights reserved.\n")
        assert "Licensed under the Apache License, Version 2.0" in text
        for line in text.splitlines():
            assert not line.startswith(("import accelerate", "from accelerate")), (name, line)
            if line.startswith(("from hpc", "import hpc")) or "tiny-" in line or '.to("cpu")' in line:
                assert "  # was: " in line, (name, line)
