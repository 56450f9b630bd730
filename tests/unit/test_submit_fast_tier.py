"""`hpc submit --state-size`: the profile's fast tier (checkpoints in node memory, issue 41) against the node memory
the job gets, before anything is submitted; the accounting is `hpc estimate-memory`'s (tests/unit/test_estimate.py).
Dry runs of the hpc command, torch-free."""

import json
import os
import subprocess
import sys
import time

import pytest

from hpc.cluster import estimate as est
from hpc.cluster import fast_tier_fit
from hpc.cluster import records as jobs
from hpc.cluster.backends.base import LocalFiles
from hpc.contract import timeline
from hpc.errors import HpcError
from tests.jobhelpers import hpc
from tests.unit.test_cli import PROBE

GiB = 2**30


@pytest.fixture
def project(tmp_path):
    """A profile with the fast tier on (replicas 2 by default) and 8G of memory a node; train.py to submit."""
    (tmp_path / "cluster_configs").mkdir()
    (tmp_path / "cluster_configs" / "fast.yaml").write_text(
        "name: fast\nextends: slurm-local\nmem: 8G\nfast_tier:\n  enabled: true\n")
    (tmp_path / "cluster_configs" / "fast-no-mem.yaml").write_text(
        "name: fast-no-mem\nextends: slurm-local\nfast_tier:\n  enabled: true\n")
    (tmp_path / "train.py").write_text("")
    return tmp_path


def dry_run(project, *args):
    proc = hpc(project, "submit", "--dry-run", "--json", *args, "train.py")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_a_fast_tier_that_fits_says_so_in_json_and_nothing_on_stderr(project):
    data, stderr = dry_run(project, "-p", "fast", "-N", "2", "--state-size", "1G")
    # once a node, x 2 replicas (the copy of the previous node's) x 3 folders (2 kept, 1 being written)
    assert data["fast_tier"] == {"bytes_per_node": 6 * GiB, "node_memory_bytes": 8 * GiB, "fits": True,
                                 "state_bytes": GiB, "state_from": "--state-size", "replicas": 2}
    assert data["fast_tier"]["bytes_per_node"] == est.fast_tier_node_bytes(GiB, 2)  # estimate-memory's formula
    assert "warning" not in stderr, stderr


def test_a_fast_tier_that_does_not_fit_is_one_warning_line_and_the_job_still_goes(project):
    data, stderr = dry_run(project, "-p", "fast", "-N", "2", "--state-size", "2G")
    assert data["fast_tier"]["fits"] is False and data["fast_tier"]["bytes_per_node"] == 12 * GiB
    assert data["script"], "a warning, not a refusal: the plan is there"
    lines = [line for line in stderr.splitlines() if "fast tier" in line]
    assert len(lines) == 1 and lines[0].startswith("hpc: warning: the fast tier needs 12.00 GiB"), stderr
    assert "mem 8G" in lines[0] and "fall back to the shared tier" in lines[0]
    assert "lower fast_tier.replicas" in lines[0] and "--mem" in lines[0]
    # the plain dry run says it too, and more --mem makes it fit
    plain = hpc(project, "submit", "--dry-run", "-p", "fast", "-N", "2", "--state-size", "2G", "train.py")
    assert plain.returncode == 0 and "hpc: warning: the fast tier needs 12.00 GiB" in plain.stderr
    more, stderr = dry_run(project, "-p", "fast", "-N", "2", "--mem", "16G", "--state-size", "2G")
    assert more["fast_tier"]["fits"] is True and more["fast_tier"]["node_memory_bytes"] == 16 * GiB
    assert "warning" not in stderr


def test_one_node_keeps_no_peer_copy(project):
    data, _ = dry_run(project, "-p", "fast", "-N", "1", "--state-size", "2G")
    assert data["fast_tier"]["replicas"] == 1 and data["fast_tier"]["bytes_per_node"] == 6 * GiB


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_a_sharded_models_node_holds_every_ranks_shards(project, strategy):
    """FSDP and DeepSpeed: each rank writes its own shards or files (--state-size: one rank's), so a node of 2 ranks
    holds 2 of them."""
    data, stderr = dry_run(project, "-p", "fast", "-N", "2", "--strategy", strategy, "--state-size", "1G")
    assert data["fast_tier"]["bytes_per_node"] == est.fast_tier_node_bytes(2 * GiB, 2) == 12 * GiB
    assert "x 2 ranks x 2 replica(s)" in stderr, stderr


def test_memory_per_gpu_times_the_gpus_of_a_node(project):
    data, _ = dry_run(project, "-p", "fast-no-mem", "-N", "2", "--gpus-per-node", "2", "--mem-per-gpu", "2G",
                      "--state-size", "1G")
    assert data["fast_tier"]["node_memory_bytes"] == 4 * GiB and data["fast_tier"]["fits"] is False


@pytest.mark.parametrize("args", [
    pytest.param(["-p", "slurm-local", "--mem", "1G"], id="fast tier off"),
    pytest.param(["-p", "fast"], id="no state size"),
])
def test_nothing_to_check(project, args):
    state = [] if args == ["-p", "fast"] else ["--state-size", "64G"]
    data, stderr = dry_run(project, "-N", "2", *args, *state)
    assert "fast_tier" not in data and "warning" not in stderr, stderr


def test_unknown_node_memory_is_no_check_and_no_message(project):
    data, stderr = dry_run(project, "-p", "fast-no-mem", "-N", "2", "--state-size", "64G")
    assert data["fast_tier"]["node_memory_bytes"] is None and data["fast_tier"]["fits"] is None
    assert "warning" not in stderr, stderr


@pytest.mark.parametrize("value, says", [
    ("3X", "is not a size"), ("-1G", "is not a size"), ("0", "must be positive"), ("", "is not a size"),
])
def test_a_bad_state_size_is_one_line_and_exit_2(project, value, says):
    proc = hpc(project, "submit", "--dry-run", "-p", "fast", "--state-size", value, "train.py")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpc: error: command line: --state-size = "), proc.stderr
    assert says in lines[0] and "fix:" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("given", [True, False], ids=["--state-size", "measured by the last run"])
def test_the_check_imports_no_torch(project, monkeypatch, given):
    if not given:
        monkeypatch.setenv("XDG_DATA_HOME", str(project / "xdg-data"))
        _earlier_job(project, "71", name="train", fast_bytes=[2 * GiB])
    args = ["submit", "--dry-run", "-p", "fast", "-N", "2", "-J", "train", *(["--state-size", "2G"] if given else []),
            "train.py"]
    env = {**os.environ, "XDG_CONFIG_HOME": str(project / "xdg"), "XDG_DATA_HOME": str(project / "xdg-data")}
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=project, capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY=", proc.stdout
    assert "hpc: warning: the fast tier needs" in proc.stderr
    assert ("measured by job 71" in proc.stderr) is not given, proc.stderr


# --- without --state-size: what the last run of the same job measured (its timelines' progress lines, fast.bytes) --

def _earlier_job(project, job_id, *, name="train", profile="fast", fast_bytes=(), at=0.0, tasks=None):
    """A job of the past (its record as `hpc submit` leaves it, test_lead_time.py's way) whose rank 0 reported
    these sizes of its newest fast save, a progress line each (``tasks``: an array's, each with the same)."""
    folder = project / f"job-{job_id}"
    (folder / "tasks").mkdir(parents=True)
    jobs.save(jobs.JobRecord(job_id=job_id, scheduler="slurm", profile=profile, name=name, job_dir=str(folder),
                             submitted_at=time.time() - 1000 + at, argv=[], workdir=str(project),
                             script="job.sbatch", array=tasks))
    for task in tasks or ["0"]:
        file = timeline.path(folder, str(task))
        timeline.append(file, "started", world=8)
        timeline.append(file, "progress", step=1)  # before the first fast save: no fast field
        for step, size in enumerate(fast_bytes, 2):
            timeline.append(file, "progress", step=step, fast={"step": step, "n": 1, "stall_s": 0.1, "replicas": 2,
                                                                "bytes": size})
    return folder


@pytest.fixture
def history(project, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(project / "xdg-data"))  # the folder `hpc` gets from tests.jobhelpers
    return project


def test_the_state_size_the_last_run_measured_is_checked_and_named(history):
    _earlier_job(history, "41", fast_bytes=[GiB, 3 * GiB, 2 * GiB], at=1)  # the largest: 3 GiB
    _earlier_job(history, "42", fast_bytes=[0], at=2)  # newer, but no fast save measured: passed over
    unreadable = _earlier_job(history, "43", at=3)
    timeline.path(unreadable, "0").unlink()
    timeline.path(unreadable, "0").mkdir()  # its timeline cannot be read: passed over, silently
    _earlier_job(history, "44", name="other", fast_bytes=[GiB], at=4)  # another job
    _earlier_job(history, "45", profile="fast-no-mem", fast_bytes=[GiB], at=5)  # the same job on another profile
    data, stderr = dry_run(history, "-p", "fast", "-N", "2", "-J", "train")
    assert data["fast_tier"]["state_bytes"] == 3 * GiB and data["fast_tier"]["state_from"] == "job 41"
    assert data["fast_tier"]["fits"] is False and data["fast_tier"]["bytes_per_node"] == 18 * GiB
    lines = [line for line in stderr.splitlines() if "fast tier" in line]
    assert len(lines) == 1 and lines[0].startswith("hpc: warning: the fast tier needs 18.00 GiB"), stderr
    assert "(3.00 GiB of state a rank (measured by job 41) x 2 replica(s)" in lines[0]
    assert "skipping" not in stderr and "Traceback" not in stderr, stderr
    # the other job's measure is its own; the state size given wins over the measured one
    other, stderr = dry_run(history, "-p", "fast", "-N", "2", "-J", "another")
    assert "fast_tier" not in other and "warning" not in stderr, stderr
    given, stderr = dry_run(history, "-p", "fast", "-N", "2", "-J", "train", "--state-size", "1G")
    assert given["fast_tier"]["state_bytes"] == GiB and given["fast_tier"]["state_from"] == "--state-size"
    assert given["fast_tier"]["fits"] is True and "warning" not in stderr, stderr


def test_a_measure_that_fits_says_so_in_json_only_and_an_array_gives_its_largest(history):
    _earlier_job(history, "51", fast_bytes=[GiB // 2], tasks=[0, 1])
    timeline.append(timeline.path(history / "job-51", "1"), "progress", step=9, fast={"bytes": GiB})
    data, stderr = dry_run(history, "-p", "fast", "-N", "2", "-J", "train")
    assert data["fast_tier"]["state_bytes"] == GiB and data["fast_tier"]["state_from"] == "job 51"
    assert data["fast_tier"]["fits"] is True and "warning" not in stderr, stderr
    # no check where there is nothing to check, measured or not
    data, stderr = dry_run(history, "-N", "2", "-J", "train", "-p", "slurm-local", "--mem", "1G")
    assert "fast_tier" not in data and "warning" not in stderr, stderr


def test_a_cluster_out_of_reach_ends_the_search_and_the_look_back_is_bounded(history):
    _earlier_job(history, "61", fast_bytes=[2 * GiB], at=1)
    _earlier_job(history, "62", at=2)
    reads = []

    def files_of(record):
        reads.append(record.job_id)
        return LocalFiles(record.dir)

    assert fast_tier_fit.measured("train", "fast", files_of) == (2 * GiB, "61") and reads == ["62", "61"]
    assert fast_tier_fit.measured("train", "fast", files_of, history=1) is None  # 61 is past the last record

    def out_of_reach(record):
        raise HpcError("ssh login failed: exit code 255")

    assert fast_tier_fit.measured("train", "fast", out_of_reach) is None
