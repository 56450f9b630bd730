"""Checkpoints in real processes: crash safety and bitwise-equal resumes (the commit protocol, damage
detection and purge in this process: tests/unit/test_checkpoint.py)."""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from hpc.runtime.checkpoint import manifest
from hpc.runtime.checkpoint.store import CheckpointStore
from tests.jobhelpers import launch_env, local_script_process

HERE = Path(__file__).parent
RESUME = HERE / "resume_worker.py"


def _start(tmp_path, spec: dict, nproc: int = 1, restart: int = 0) -> subprocess.Popen:
    env = launch_env()
    env["HPC_RESTART_COUNT"] = str(restart)
    cmd = [sys.executable, "-m", "hpc", "launch", "--nproc", str(nproc), str(RESUME), json.dumps(spec)]
    # output to files, not pipes: a run in the background is read only when it has ended
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=err, text=True)
    proc.files = out, err
    return proc


def _finish(proc: subprocess.Popen, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    for f in proc.files:
        f.seek(0)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, *(f.read() for f in proc.files))
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def _launch(tmp_path, spec: dict, nproc: int = 1, restart: int = 0, check: bool = True):
    return _finish(_start(tmp_path, spec, nproc, restart), check)


def _result(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def assert_same_run(a: dict, b: dict) -> None:
    assert a["losses"] == b["losses"], "per-step losses differ"
    assert [row[0] for row in b["losses"]] == list(range(1, len(b["losses"]) + 1)), "a step was lost or repeated"
    assert a["weights"].keys() == b["weights"].keys()
    for name in a["weights"]:
        assert torch.equal(a["weights"][name], b["weights"][name]), name


# background saves (a save may be in flight at the crash); synchronous ones resume in test_preemption_slurm
@pytest.mark.parametrize("strategy,nproc,async_save,kill", [("ddp", 2, True, False), ("fsdp", 2, True, True)])
def test_crash_and_resume_matches_the_straight_run_bitwise(tmp_path, strategy, nproc, async_save, kill):
    """30 steps (over an epoch boundary, with dropout and a scheduler) straight, and the same job crashed at
    step 13 (an exception, or SIGKILL of one rank) and started again: the same losses and weights."""
    common = {"strategy": strategy, "steps": 30, "save_every": 4, "async": async_save}
    straight = {**common, "project": str(tmp_path / "a"), "out": str(tmp_path / "a.pt")}
    crashed = {**common, "project": str(tmp_path / "b"), "out": str(tmp_path / "b.pt"), "crash_at": 13,
               "world_kill": kill}
    _launch(tmp_path, straight, nproc)
    first = _launch(tmp_path, crashed, nproc, check=False)
    assert first.returncode != 0 and not (tmp_path / "b.pt").exists()
    second = _launch(tmp_path, crashed, nproc, restart=1)
    # a background save of step 12 may still be in flight when a rank is killed at step 13: then step 8
    newest = ("step-12 ",) if not (async_save and kill) else ("step-8 ", "step-12 ")
    assert "resumed from" in second.stderr and any(s in second.stderr for s in newest), second.stderr
    a, b = _result(tmp_path / "a.pt"), _result(tmp_path / "b.pt")
    assert b["attempts"] == [(0, 0), (1, 0)]
    assert_same_run(a, b)
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["step-24", "step-28"]


def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(tmp_path):
    spec = {"steps": 10, "save_every": 5, "project": str(tmp_path / "p"), "out": str(tmp_path / "p.pt")}
    # the straight run to compare with needs nothing of the others: one process, beside them on the second core
    straight = _start(tmp_path, {**spec, "steps": 12, "project": str(tmp_path / "s"), "out": str(tmp_path / "s.pt")})
    _launch(tmp_path, spec)
    model = tmp_path / "p" / "checkpoints" / "step-10" / "model_0.pt"
    raw = bytearray(model.read_bytes())
    raw[-100] ^= 0x01
    model.write_bytes(bytes(raw))
    resumed = _launch(tmp_path, {**spec, "steps": 12, "out": str(tmp_path / "r.pt")}, restart=1)
    assert "skipping damaged checkpoint step-10" in resumed.stderr and "does not match" in resumed.stderr
    assert "resumed from" in resumed.stderr and "step-5 " in resumed.stderr
    _finish(straight)
    assert_same_run(_result(tmp_path / "s.pt"), _result(tmp_path / "r.pt"))


def test_fsdp_checkpoint_loads_at_another_world_size(tmp_path):
    spec = {"strategy": "fsdp", "steps": 6, "project": str(tmp_path / "p"), "out": str(tmp_path / "two.pt")}
    _launch(tmp_path, spec, nproc=2)
    # one process, nothing left to train: it only resumes (2 shards -> 1) and gathers the weights
    _launch(tmp_path, {**spec, "out": str(tmp_path / "one.pt")}, nproc=1, restart=1)
    two, one = _result(tmp_path / "two.pt"), _result(tmp_path / "one.pt")
    for name in two["weights"]:
        assert torch.equal(two["weights"][name], one["weights"][name]), name


def test_sigkill_at_random_points_never_leaves_a_bad_newest_checkpoint(tmp_path):
    """20 saves killed at random moments (sync and background saves of 16 MiB): the newest committed
    checkpoint always verifies and holds exactly its own step's weights; partial folders are never chosen."""
    rng = random.Random(1234)
    trials, partial_seen = 20, 0
    saver = subprocess.Popen([sys.executable, str(HERE / "crash_saver.py"), str(tmp_path), "16"], env=launch_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    # two savers at a time (a core each on a 2-core machine, each in its own folder), each killed after its own
    # random time: the same 20 kills in about 60% of the time one at a time takes
    kills = []
    for trial in range(trials):
        saver.stdin.write("go\n")
        saver.stdin.flush()
        pid = int(saver.stdout.readline().split()[1])  # a fork of a process that imported torch: no start-up
        kills.append((time.monotonic() + rng.uniform(0.3, 1.5), trial, pid))
        if len(kills) < 2 and trial < trials - 1:
            continue
        for at, _, pid in sorted(kills):
            time.sleep(max(0.0, at - time.monotonic()))
            os.kill(pid, signal.SIGKILL)
        for _, killed, _ in kills:
            partial_seen += _check_newest(tmp_path / f"t{killed}" / "checkpoints")
        kills = []
    saver.stdin.close()
    saver.wait(timeout=30)
    assert partial_seen > 0, "no kill landed inside a save: the test did not test anything"


def _check_newest(folder: Path) -> bool:
    """The newest committed checkpoint verifies and holds exactly its own step's weights; True if a partial
    (uncommitted) folder is there too."""
    store = CheckpointStore(folder)
    committed = store.committed()
    if committed:
        newest = committed[0]
        assert all(e.step <= newest.step for e in committed)
        assert manifest.verify(newest.path, newest.manifest["files"]) is None, newest.path
        state = torch.load(newest.path / "model_0.pt", weights_only=True)
        assert all(bool((t == newest.step).all()) for t in state.values()), newest.path
    return any(not e.committed for e in store.entries())


def test_save_into_an_explicit_folder_and_load_it_back(tmp_path):
    code = f"""
import torch
from hpc import Accelerator
acc = Accelerator(project_dir={str(tmp_path)!r})
model = acc.prepare(torch.nn.Linear(4, 2))
acc.save_state({str(tmp_path / 'mine')!r})
before = {{k: v.clone() for k, v in model.state_dict().items()}}
with torch.no_grad():
    model.weight.zero_()
acc.load_state({str(tmp_path / 'mine')!r})
assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
bad = {str(tmp_path / 'mine' / 'model_0.pt')!r}
data = bytearray(open(bad, 'rb').read()); data[-50] ^= 1; open(bad, 'wb').write(bytes(data))
try:
    acc.load_state({str(tmp_path / 'mine')!r})
except Exception as e:
    print("ERR", e)
"""
    proc = subprocess.run([sys.executable, "-c", code], env=launch_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ERR cannot load checkpoint" in proc.stdout and "model_0.pt: checksum" in proc.stdout


def _merge(path: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc", "merge-weights", str(path), *args], env=launch_env(),
                          capture_output=True, text=True, timeout=300)


def test_merge_weights_writes_the_trained_model_as_one_file(tmp_path):
    from safetensors.torch import load_file

    strategy = "fsdp"

    spec = {"strategy": strategy, "steps": 6, "save_every": 3, "project": str(tmp_path / "p"),
            "out": str(tmp_path / "p.pt")}
    _launch(tmp_path, spec, nproc=2)
    trained = _result(tmp_path / "p.pt")["weights"]
    proc = _merge(tmp_path / "p", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["checkpoint"].endswith("step-6") and info["output"].endswith("step-6.safetensors")
    merged = load_file(info["output"])
    assert merged.keys() == trained.keys()
    for name in trained:
        assert torch.equal(merged[name], trained[name]), name
    victim = next((tmp_path / "p" / "checkpoints" / "step-6").rglob("*.distcp"))
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    victim.write_bytes(bytes(raw))
    bad = _merge(tmp_path / "p" / "checkpoints" / "step-6", "-o", str(tmp_path / "x.safetensors"))
    assert bad.returncode == 2 and "does not match the manifest" in bad.stderr and len(bad.stderr.splitlines()) == 1
    assert not (tmp_path / "x.safetensors").exists()


def test_deepspeed_zero2_crash_and_resume_matches_the_straight_run_and_merges(tmp_path):
    from safetensors.torch import load_file

    common = {"strategy": "deepspeed", "zero_stage": 2, "steps": 12, "save_every": 4}
    _launch(tmp_path, {**common, "project": str(tmp_path / "a"), "out": str(tmp_path / "a.pt")}, 2)
    crashed = {**common, "project": str(tmp_path / "b"), "out": str(tmp_path / "b.pt"), "crash_at": 7}
    assert _launch(tmp_path, crashed, 2, check=False).returncode != 0
    assert "step-4 " in _launch(tmp_path, crashed, 2, restart=1).stderr
    b = _result(tmp_path / "b.pt")
    assert_same_run(_result(tmp_path / "a.pt"), b)
    # ZeRO partitions -> one file
    proc = _merge(tmp_path / "b", "-o", str(tmp_path / "b.safetensors"), "--trust-pickles")
    assert proc.returncode == 0, proc.stderr
    merged = load_file(tmp_path / "b.safetensors")
    assert merged.keys() == b["weights"].keys()
    for name, tensor in b["weights"].items():  # the fp32 master weights: what the engine trained
        assert torch.equal(merged[name], tensor.float()), name


def test_the_local_profile_requeues_by_starting_its_processes_again(tmp_path):
    """The warning signal on the local profile: checkpoint at the step boundary, the script runs the ranks
    again (HPC_RESTART_COUNT=1), they resume; the same losses and weights as a straight run. The profile keeps
    checkpoints in node memory too (issue 41): the fast tier is written first at the signal, the requeue on the
    same node reads it, and the run's end frees it."""
    import shutil

    from tests.jobhelpers import hpc, start_straight_run, straight_run, submit

    shutil.copy(RESUME, tmp_path)
    memory = tmp_path / "shm"
    memory.mkdir()
    profile = tmp_path / "local-fast.yaml"
    profile.write_text(f"name: local-fast\nextends: local\nfast_tier:\n  enabled: true\n  directory: {memory}\n")
    spec = {"strategy": "ddp", "steps": 16, "save_every": 4}
    start_straight_run(spec, tmp_path)  # in the background while the job runs (or the session's, if it ran already)
    # the first attempt sleeps 0.3 s a step, room for the signal; the second resumes and runs straight through
    run = {**spec, "sleep": 0.3, "sleep_attempts": 1, "project": str(tmp_path / "b"), "out": str(tmp_path / "b.pt")}
    info = submit(tmp_path, "-p", str(profile), "--nproc", "2", "resume_worker.py", "--", json.dumps(run))
    script = local_script_process(Path(info["job_dir"]))
    progress, deadline = tmp_path / "b" / "progress", time.monotonic() + 120
    while not (progress.exists() and int(progress.read_text() or 0) >= 5):
        assert time.monotonic() < deadline and not (tmp_path / "b.pt").exists(), "it ended before the signal"
        time.sleep(0.1)
    script.send_signal(signal.SIGUSR1)
    assert hpc(tmp_path, "wait", info["job_id"], timeout=180).returncode == 0
    straight, result = straight_run(spec, tmp_path), _result(tmp_path / "b.pt")
    assert_same_run(straight, result)
    assert [a[0] for a in result["attempts"]] == [0, 1]
    logs = hpc(tmp_path, "logs", "--all", info["job_id"], check=True).stdout
    assert "stop requested (USR1)" in logs and "starting the processes again (round 1)" in logs, logs[-3000:]
    assert ", the node tier)" in logs, logs[-3000:]  # the requeue read node memory, not the shared filesystem
    assert list(memory.iterdir()) == []  # the run's end gave the memory back
