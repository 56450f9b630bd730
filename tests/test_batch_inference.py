"""Batch-inference jobs run whole: one process rerun, signalled and killed; two ranks; a local job in `hpc status`.
(The 2-node job preempted twice on SLURM: tests/test_batch_inference_slurm.py.)"""

import json
import signal
import subprocess
import sys
import time

from hpc.contract import batch_outputs as names
from tests.unit.test_batch_inference import CLEAN_ENV, WORKER, expected, ledger_chunks, outputs, run_worker


# --- whole runs, one process ----------------------------------------------------------------------------
def test_a_rerun_skips_every_committed_chunk_refuses_another_shape_and_a_finished_output_has_its_manifest(tmp_path):
    spec = {"out": str(tmp_path / "out"), "items": 50, "chunk_size": 8, "ledger": str(tmp_path / "ledger")}
    first = run_worker(spec)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"rank": 0, "items_done": 50, "num_items": 50, "complete": True}
    again = run_worker(spec)
    assert again.returncode == 0, again.stderr
    assert ledger_chunks(tmp_path / "ledger") == list(range(7))  # the second run committed nothing
    manifest = json.loads((tmp_path / "out" / names.MANIFEST).read_text())
    assert manifest["complete"] and [c["chunk"] for c in manifest["chunks"]] == list(range(7))
    other = run_worker({**spec, "chunk_size": 10})
    assert other.returncode == 2
    assert "was started with num_items=50, chunk_size=8" in other.stderr and "Traceback" not in other.stderr
    assert outputs(tmp_path / "out") == expected(50)


def _start(spec: dict, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), json.dumps(spec)], env={**CLEAN_ENV, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_commits(ledger, n: int, procs) -> None:
    deadline = time.monotonic() + 60
    while not ledger.exists() or len(ledger_chunks(ledger)) < n:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.02)


def test_a_signal_stops_between_chunks_and_the_next_attempt_does_the_rest_once(tmp_path):
    """The warning signal asks the job script for a requeue (exit 0); TERM, and the warning signal where nothing
    can requeue, end the process with the signal's code. Either way no chunk is written twice. (The three cases
    run side by side.)"""
    cases = {"usr1-requeue": ("USR1", True), "term": ("TERM", False), "usr1-alone": ("USR1", False)}
    specs, procs = {}, {}
    for name, (_, requeue_file) in cases.items():
        specs[name] = {"out": str(tmp_path / name / "out"), "items": 200, "chunk_size": 4, "sleep": 0.05,
                       "ledger": str(tmp_path / name / "ledger")}
        (tmp_path / name).mkdir()
        procs[name] = _start(specs[name], {"HPC_REQUEUE_FILE": str(tmp_path / name / "requeue")}
                             if requeue_file else {})
    for name, (signame, _) in cases.items():
        _wait_for_commits(tmp_path / name / "ledger", 3, [procs[name]])
        procs[name].send_signal(getattr(signal, f"SIG{signame}"))
    for name, (signame, requeue_file) in cases.items():
        _, err = procs[name].communicate(timeout=30)
        code = 0 if requeue_file else 128 + getattr(signal, f"SIG{signame}")
        assert procs[name].returncode == code, (name, err)
        assert f"stop requested ({signame})" in err and "Traceback" not in err, err
        assert (tmp_path / name / "requeue").exists() == requeue_file
        assert 3 <= len(ledger_chunks(tmp_path / name / "ledger")) < 50
    reruns = {name: _start(spec) for name, spec in specs.items()}
    for name, proc in reruns.items():
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert sorted(ledger_chunks(tmp_path / name / "ledger")) == list(range(50))  # each chunk committed once
        assert outputs(tmp_path / name / "out") == expected(200)


def test_a_kill_at_any_point_loses_at_most_the_chunk_in_flight(tmp_path):
    """SIGKILL (SLURM's end of a grace time, an OOM kill) at several points, then a run to the end: every item's
    output present once and right, whatever the kill cut."""
    ledger = tmp_path / "ledger"
    spec = {"out": str(tmp_path / "out"), "items": 300, "chunk_size": 3, "ledger": str(ledger)}
    for commits in (1, 17, 40):
        proc = _start(spec)
        _wait_for_commits(ledger, commits, [proc])
        proc.kill()
        proc.wait()
    assert run_worker(spec).returncode == 0
    assert outputs(tmp_path / "out") == expected(300)
