"""A run checkpointed at one world size and resumed at another, in real ranks (gloo), for each strategy: every
epoch's samples are trained once each, and with a fixed global batch the weights are the straight run's.

One launch at the first world size is the straight run and leaves the checkpoint behind (it trains on through
it); a second launch at the other world size resumes from a copy of it (auto_resume, mid-epoch). The data position
itself is tested over every kind of loader and shape in tests/unit/test_resume_shape.py.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.jobhelpers import launch_env

WORKER = Path(__file__).parent / "shape_worker.py"
EPOCHS = 2


def _launch(tmp_path, spec: dict, nproc: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hpc", "launch", "--nproc", str(nproc), str(WORKER), json.dumps(spec)]
    return subprocess.run(cmd, cwd=tmp_path, env=launch_env(), capture_output=True, text=True, timeout=300)


def _checked(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def straight_and_resumed(tmp_path, strategy, batch, save_point, before, after, save_at=3, script=False):
    common = {"strategy": strategy, "batch": batch, "epochs": EPOCHS, "save_point": save_point, "save_at": save_at}
    at = tmp_path / "at"
    _checked(_launch(tmp_path, {**common, "project": str(tmp_path / "a"), "out": str(tmp_path / "a.pt"),
                                "named": str(at)}, before))
    spec = {**common, "project": str(tmp_path / "b"), "out": str(tmp_path / "b.pt")}
    if script:  # the script loads the folder and skips its own count: the batches it trained, one a step
        spec.update({"load": str(at), "skip": save_at})
    else:
        shutil.copytree(at, tmp_path / "b" / "checkpoints" / f"step-{save_at}")
    done = _launch(tmp_path, spec, after)
    return done, tmp_path / "a.pt", tmp_path / "b.pt"


def assert_each_sample_once_an_epoch(result: dict) -> None:
    for epoch, ids in enumerate(result["epochs"]):
        assert sorted(ids) == list(range(64)), f"epoch {epoch}: {sorted(ids)}"


CASES = [  # strategy, batch held fixed, save point, world before -> after
    ("ddp", "global", "step", 2, 1),
    ("ddp", "rank", "fetch", 2, 4),
    ("ddp", "global", "fetch", 4, 2),
    ("fsdp", "global", "fetch", 2, 1),
    ("fsdp", "rank", "step", 2, 4),
    ("fsdp", "global", "step", 4, 2),
]


@pytest.mark.parametrize("strategy,batch,save_point,before,after", CASES,
                         ids=[f"{s}-{b}-{p}-{x}to{y}" for s, b, p, x, y in CASES])
def test_a_resume_at_another_world_size_trains_each_sample_once(tmp_path, strategy, batch, save_point, before, after):
    done, a, b = straight_and_resumed(tmp_path, strategy, batch, save_point, before, after)
    _checked(done)
    assert f"saved at world size {before}, this job runs at {after}" in done.stderr, done.stderr[-2000:]
    straight, resumed = torch.load(a), torch.load(b)
    assert_each_sample_once_an_epoch(straight)
    assert_each_sample_once_an_epoch(resumed)
    if batch == "global":  # the same samples in each step: the same training, to rounding
        assert resumed["steps"] == straight["steps"]
        for name, w in straight["weights"].items():
            torch.testing.assert_close(resumed["weights"][name], w, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("save_point", ["step", "fetch"])
def test_a_script_that_skips_its_own_count_after_load_state_resumes_exactly(tmp_path, save_point):
    """Saved after optimizer step 3, or after fetching the fourth batch and before training it: either way the
    checkpoint holds 3 batches, and the script's skip_first_batches(3) is taken as it is, without a note."""
    done, a, b = straight_and_resumed(tmp_path, "ddp", "global", save_point, 2, 2, script=True)
    _checked(done)
    assert "skip_first_batches" not in done.stderr, done.stderr[-2000:]
    straight, resumed = torch.load(a), torch.load(b)
    assert resumed["epochs"] == straight["epochs"]
    for name, w in straight["weights"].items():
        assert torch.equal(resumed["weights"][name], w), name


def test_a_script_that_skips_after_a_shape_change_goes_on_where_the_checkpoint_stopped(tmp_path):
    """3 steps of 8 samples at world 2; at world 4, 3 batches of every rank would be 48 samples."""
    done, a, b = straight_and_resumed(tmp_path, "ddp", "rank", "fetch", 2, 4, script=True)
    _checked(done)
    assert "skip_first_batches(3): the checkpoint stopped after 24 samples of epoch 0" in done.stderr
    assert "would lose 24 samples" in done.stderr
    assert_each_sample_once_an_epoch(torch.load(b))


def test_zero_at_another_world_size_is_refused_naming_both_sizes(tmp_path):
    done, _, b = straight_and_resumed(tmp_path, "deepspeed", "global", "step", 2, 1)
    assert done.returncode != 0 and not b.exists()
    line = next(x for x in done.stderr.splitlines() if "saved at world size 2" in x)
    assert "runs at 1" in line and "do not reshard" in line


def test_zero_saved_after_fetching_a_batch_resumes_exactly_at_the_same_size(tmp_path):
    done, a, b = straight_and_resumed(tmp_path, "deepspeed", "global", "fetch", 2, 2)
    _checked(done)
    straight, resumed = torch.load(a), torch.load(b)
    assert_each_sample_once_an_epoch(resumed)
    assert resumed["epochs"] == straight["epochs"]
    for name, w in straight["weights"].items():
        torch.testing.assert_close(resumed["weights"][name], w, rtol=1e-5, atol=1e-6, msg=name)


SGD_SAVES = """import sys, torch
from hpc import Accelerator, FullyShardedDataParallelPlugin
acc = Accelerator(project_dir=sys.argv[1], fsdp_plugin=FullyShardedDataParallelPlugin())
model = torch.nn.Linear(4, 4)
model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
acc.backward(model(torch.randn(2, 4)).sum())
opt.step()
acc.save_state()
acc.save_state()
print("completed_steps", acc.completed_steps)
acc.end_training()
"""


def test_saving_fsdp_state_of_a_stateless_optimizer_takes_no_training_step(tmp_path):
    """DCP gives plain SGD its state by stepping it with lr 0; through hpc's wrapper that counted as a training step
    at every save (completed_steps 3 after one step and two saves, step-1 and step-2 folders)."""
    (tmp_path / "sgd.py").write_text(SGD_SAVES)
    done = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", str(tmp_path / "sgd.py"),
                           str(tmp_path / "p")], cwd=tmp_path, env=launch_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "completed_steps 1" in done.stdout and "completed_steps 3" not in done.stdout
    assert sorted(p.name for p in (tmp_path / "p" / "checkpoints").iterdir()) == ["step-1"]
