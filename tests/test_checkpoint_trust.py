"""Checkpoints are verified before they are trusted, and never unpickled (issue 22, "Trust on a shared cluster").

Whoever can write a checkpoint folder can rewrite a file and its manifest entry alike: checksums catch damage,
not a planted pickle. These tests plant what such a user could (a pickle whose loading writes a marker file, a
malformed manifest, a damaged final checkpoint, a link at a temporary name) and check that hpc refuses or
routes around it in one line. Here, in training processes (`hpc launch`); retention, manifests, schedulers and
`hpc merge-weights` in this process: tests/unit/test_checkpoint_trust.py.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpc.runtime.checkpoint import manifest
from tests.jobhelpers import launch_env

HERE = Path(__file__).parent


# --- in one process: refusals, malformed manifests, shape mismatches ------------------------------------------
# one `hpc launch` per checkpoint format runs every scenario and reports each; the tests below read the report
WORKER = r'''
import fractions, json, os, pickle, random, shutil, sys
from pathlib import Path

import numpy
import torch

from hpc import Accelerator, FullyShardedDataParallelPlugin
from hpc.errors import HpcError
from hpc.runtime.checkpoint import manifest, safe_load

strategy, project = sys.argv[1], Path(sys.argv[2])
marker = project / "marker"
extra = {"fsdp_plugin": FullyShardedDataParallelPlugin()} if strategy == "fsdp" else {}
acc = Accelerator(project_dir=project, **extra)
report = {}


class Planted:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


class Notes:
    def __init__(self, value):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def build(width):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.9 ** step)  # its state drops the lambda
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, width))
    return acc.prepare(model, opt, sched, torch.utils.data.DataLoader(data, batch_size=4))


def train(model, opt, sched, loader, until):
    for xb, yb in loader:
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(xb), yb))
            opt.step()
            sched.step()
            opt.zero_grad()
        if acc.completed_steps >= until:
            return


def weights(model):
    return {k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone()
            for k, v in model.state_dict().items()}


def attempt(folder):
    """load_state(folder): None, or the refusal's text."""
    try:
        acc.load_state(folder)
    except HpcError as e:
        return str(e)
    return None


def rehash(folder):
    data = manifest.read(folder)
    data["files"] = {name: manifest.file_entry(folder / name) for name in data["files"]}
    manifest.write_json_atomic(folder / manifest.NAME, data, fsync=False)


model, opt, sched, loader = build(2)
notes = Notes(["plain", 1, 2.5])
acc.register_for_checkpointing(notes)
train(model, opt, sched, loader, 1)
acc.save_state()
train(model, opt, sched, loader, 2)
step2 = acc.save_state()
store = project / "checkpoints"

# a planted pickle in each file resume reads besides the weights: refused, nothing run, nothing changed
planted = ["rng/rank0.pt", "scheduler_0.pt", "custom_0.pt"] + (["dcp/.metadata"] if strategy == "fsdp" else [])
for name in planted:
    folder = project / ("planted-" + name.replace("/", "-"))
    shutil.copytree(step2, folder)
    if name.endswith(".metadata"):
        (folder / name).write_bytes(pickle.dumps(Planted(marker)))
    else:
        torch.save({"state": Planted(marker)}, folder / name)
    rehash(folder)
    before = weights(model)
    error = attempt(folder)
    after = weights(model)
    report[name] = {"error": error, "marker": marker.exists(),
                    "unchanged": all(torch.equal(before[k], after[k]) for k in before)}

# an RNG file of an earlier hpc (numpy's state as its pickled ndarray) still loads, under weights_only
folder = project / "old-rng"
shutil.copytree(step2, folder)
random.seed(5); numpy.random.seed(6); torch.manual_seed(7)
torch.save({"python": random.getstate(), "torch": torch.get_rng_state(), "numpy": numpy.random.get_state()},
           folder / "rng/rank0.pt")
rehash(folder)
drawn = [random.random(), float(numpy.random.rand()), torch.rand(1).item()]
report["old_rng"] = {"error": attempt(folder),
                     "same": drawn == [random.random(), float(numpy.random.rand()), torch.rand(1).item()]}

# a registered object whose state needs a pickle: only with the opt-in
odd = Notes(fractions.Fraction(1, 3))
acc.register_for_checkpointing(odd)
acc.save_state(project / "odd")
odd.value = None
report["odd_refused"] = attempt(project / "odd")
os.environ[safe_load.TRUST_ENV] = "1"
report["odd_trusted"] = {"error": attempt(project / "odd"), "value": str(odd.value)}
del os.environ[safe_load.TRUST_ENV]
acc.training.custom_objects.remove(odd)

# a malformed manifest on the newest checkpoint: skipped for the one before (the note goes to stderr)
good = (step2 / manifest.NAME).read_text()
shapes = {"files_list": lambda d: {**d, "files": sorted(d["files"])},
          "entry_not_mapping": lambda d: {**d, "files": {k: 5 for k in d["files"]}},
          "step_text": lambda d: {**d, "step": "two"},
          "loaders_text": lambda d: {**d, "loaders": "all"},
          "not_an_object": lambda d: [d],
          "format_unknown": lambda d: {**d, "format": "zarr"},
          "format_missing": lambda d: {k: v for k, v in d.items() if k != "format"}}
report["malformed"] = {}
for what, spoil in shapes.items():
    (step2 / manifest.NAME).write_text(json.dumps(spoil(json.loads(good))))
    print(f"-- malformed {what}", file=sys.stderr, flush=True)
    try:
        report["malformed"][what] = acc.load_state().step
    except Exception as e:  # the bug this guards against: a traceback instead of the step before
        report["malformed"][what] = repr(e)
(step2 / manifest.NAME).write_text(good)

# the model changed between the runs: one line naming the folder, the keys and both shapes
acc.free_memory()
model, opt, sched, loader = build(3)  # the registered notes stay registered
report["shape"] = attempt(store / "step-1")
report["folder"] = str(store / "step-1")
Path(sys.argv[3]).write_text(json.dumps(report))
acc.end_training()
'''


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def trust_run(request, tmp_path_factory):
    """One single-rank run per checkpoint format (full files; DCP shards): ~8 s each."""
    tmp = tmp_path_factory.mktemp(f"trust-{request.param}")
    (tmp / "worker.py").write_text(WORKER)
    cmd = [sys.executable, "-m", "hpc", "launch", "--nproc", "1", str(tmp / "worker.py"), request.param,
           str(tmp / "project"), str(tmp / "report.json")]
    proc = subprocess.run(cmd, cwd=tmp, env=launch_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return request.param, json.loads((tmp / "report.json").read_text()), proc.stderr, tmp


def test_a_planted_pickle_in_any_file_resume_reads_is_refused_in_one_line_and_never_run(trust_run):
    strategy, report, _, tmp = trust_run
    names = ["rng/rank0.pt", "scheduler_0.pt", "custom_0.pt"] + (["dcp/.metadata"] if strategy == "fsdp" else [])
    for name in names:
        seen = report[name]
        assert seen["error"] is not None, f"{name} loaded"
        assert "\n" not in seen["error"] and name in seen["error"], seen["error"]
        assert "refused" in seen["error"] and "HPC_TRUST_CHECKPOINT_PICKLES=1" in seen["error"], seen["error"]
        assert not seen["marker"], f"loading {name} ran the planted code"
        assert seen["unchanged"], f"a refused load of {name} changed the model"
    assert not (tmp / "project" / "marker").exists()


def test_old_rng_files_and_plain_states_still_load(trust_run):
    _, report, _, _ = trust_run
    assert report["old_rng"] == {"error": None, "same": True}


def test_a_registered_objects_pickled_state_loads_only_with_the_opt_in(trust_run):
    _, report, stderr, _ = trust_run
    refused = report["odd_refused"]
    assert refused is not None and "custom_1.pt" in refused and "fractions.Fraction" in refused, refused
    assert "HPC_TRUST_CHECKPOINT_PICKLES=1" in refused and "\n" not in refused
    assert report["odd_trusted"] == {"error": None, "value": "1/3"}
    unpickled = [line for line in stderr.splitlines() if line.startswith("hpc: unpickling ")]
    assert len(unpickled) == 1 and "custom_1.pt" in unpickled[0], unpickled  # on record, and only that file


def test_a_malformed_manifest_is_a_damaged_checkpoint_skipped_for_the_one_before(trust_run):
    _, report, stderr, _ = trust_run
    assert report["malformed"] == dict.fromkeys(
        ["files_list", "entry_not_mapping", "step_text", "loaders_text", "not_an_object", "format_unknown",
         "format_missing"], 1), report["malformed"]
    notes = [line for line in stderr.splitlines() if "skipping damaged checkpoint step-2" in line]
    assert len(notes) == 7 and all("manifest.json is malformed" in n for n in notes), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]


def test_a_model_that_changed_shape_is_named_in_one_line(trust_run):
    _, report, _, _ = trust_run
    line = report["shape"]
    assert line is not None and "\n" not in line, line
    assert report["folder"] in line and "does not fit model 0" in line
    assert "weight is [2, 4] in the checkpoint, [3, 4] in the model" in line, line
    assert "bias is [2] in the checkpoint, [3] in the model" in line, line


# --- a damaged final checkpoint, two ranks ---------------------------------------------------------------------
def _launch(tmp_path: Path, spec: dict, restart: int = 0) -> subprocess.CompletedProcess:
    env = {**launch_env(), "HPC_RESTART_COUNT": str(restart)}
    cmd = [sys.executable, "-m", "hpc", "launch", "--nproc", "2", str(HERE / "resume_worker.py"), json.dumps(spec)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_a_damaged_final_checkpoint_is_trained_again_to_the_end_and_saved_again(tmp_path):
    """The job's last checkpoint (step-10) is damaged and the job runs again: completed_steps must not take the
    damaged step-10 for the end; training goes on from step-5 to step 10 on both ranks, ends with the weights of
    a straight run, and step-10 is written again whole (not left damaged among the kept). ~25 s."""
    spec = {"strategy": "ddp", "steps": 10, "save_every": 5, "project": str(tmp_path / "p"),
            "out": str(tmp_path / "straight.pt")}
    _launch(tmp_path, spec)
    final = tmp_path / "p" / "checkpoints" / "step-10"
    straight_model = torch.load(final / "model_0.pt", weights_only=True)
    raw = bytearray((final / "model_0.pt").read_bytes())
    raw[-100] ^= 0x01
    (final / "model_0.pt").write_bytes(bytes(raw))
    again = _launch(tmp_path, {**spec, "out": str(tmp_path / "again.pt")}, restart=1)
    assert "skipping damaged checkpoint step-10" in again.stderr and "step-5 " in again.stderr, again.stderr[-3000:]
    straight, resumed = (torch.load(tmp_path / n, weights_only=True) for n in ("straight.pt", "again.pt"))
    assert resumed["losses"] == straight["losses"], "the steps after the damaged checkpoint were not trained"
    for name, tensor in straight["weights"].items():
        assert torch.equal(resumed["weights"][name], tensor), name
    assert manifest.check(final, manifest.read(final)) is None, "step-10 was left damaged"
    saved_again = torch.load(final / "model_0.pt", weights_only=True)
    assert all(torch.equal(saved_again[k], v) for k, v in straight_model.items())
    assert sorted(p.name for p in final.parent.iterdir()) == ["step-10", "step-5"]
