"""Vetting in one process: a node's own checks, the pairings of the link test, the verdict and the choice of
nodes, one node's whole probe, and the job settings render refuses. (On SLURM: tests/test_vetting_slurm.py.)"""

import json
import os
import socket
import stat
import subprocess
import sys

import pytest

from hpc.contract import vetting_verdict as select
from hpc.runtime.vetting import network, node_checks, probe
from tests.conftest import hpc_cmd


# --- a node's own checks -------------------------------------------------------------------------------
def test_health_check_lines_pass_fail_and_time_out():
    checks = node_checks.health_check_lines(["true", "echo disk sick >&2; exit 3", "sleep 5"], timeout_s=0.5)
    assert [c.ok for c in checks] == [True, False, False]
    assert checks[1].detail == "exit 3: disk sick"
    assert "no answer within 0.5 s" in checks[2].detail


def test_free_memory_and_disk_against_their_minimum(tmp_path):
    assert node_checks.free_memory("1M").ok and not node_checks.free_memory("100000T").ok
    checks = node_checks.free_disk([str(tmp_path), str(tmp_path), "", str(tmp_path / "gone")], "1M")
    assert [c.ok for c in checks] == [True, False]  # each folder once; one that is not there fails
    assert not node_checks.free_disk([str(tmp_path)], "100000T")[0].ok


@pytest.mark.parametrize("env, gpus", [({}, 0), ({"SLURM_GPUS_ON_NODE": "4"}, 4), ({"SLURM_JOB_GPUS": "0,1,2"}, 3)])
def test_the_gpus_slurm_gave_the_node(env, gpus):
    assert node_checks.expected_gpus(env) == gpus


def _fake(tmp_path, monkeypatch, name: str, output: str) -> None:
    tool = tmp_path / "bin" / name
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")


def test_nvidia_smis_counters_mark_a_gpu_that_should_not_be_trusted(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch, "nvidia-smi", "0, 0, No, Not Active\n1, 2, No, Not Active\n2, 0, Yes, Active")
    checks = node_checks.nvidia_smi()
    assert [(c.name, c.ok) for c in checks] == [("GPU 0", True), ("GPU 1", False), ("GPU 2", False)]
    assert checks[1].detail == "2 uncorrected ECC errors"
    assert checks[2].detail == "page retirement pending, hardware slowdown active"


def test_fatal_xid_errors_in_the_kernel_log(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch, "dmesg", "[ 1.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception\n"
                                          "[ 2.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus")
    check = node_checks.xid_errors()
    assert not check.ok and check.detail == "fatal XID [79] in the kernel log"
    _fake(tmp_path, monkeypatch, "dmesg", "[ 1.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception")
    assert node_checks.xid_errors().ok


# --- the link test's pairs -----------------------------------------------------------------------------
@pytest.mark.parametrize("world", range(1, 10))
def test_each_round_pairs_nodes_once_and_each_node_meets_new_partners(world):
    rounds = network.pairings(world)
    met = {r: [] for r in range(world)}
    for partner in rounds:
        assert all(partner[partner[a]] == a and partner[a] != a for a in partner)
        for a, b in partner.items():
            met[a].append(b)
    for node, partners in met.items():
        assert len(partners) == len(set(partners))  # a new partner each round
        assert len(partners) >= min(world - 1, 2)  # enough to tell a slow node from a slow neighbour


# --- the verdict and the choice ------------------------------------------------------------------------
def report(host, compute=100.0, links=(1.0,), failed=()):
    return {"host": host, "compute_gflops": compute, "links_gbps": {str(i): v for i, v in enumerate(links)},
            "checks": [{"name": n, "ok": False, "detail": "broken"} for n in failed]}


def test_a_failed_check_or_a_missing_report_is_bad_and_a_node_far_below_the_median_is_slow():
    verdicts = select.judge({"a": report("a"), "b": report("b", compute=20), "c": None,
                             "d": report("d", failed=["GPU 1"]), "e": report("e", links=(0.2, 0.3))},
                            relative_speed=0.5, min_bandwidth=None)
    by = {v.host: v for v in verdicts}
    assert by["a"].fit
    assert by["b"].slow == ["compute 20 GFLOP/s, 20% of the median node's"]
    assert by["c"].bad and "no vetting report" in by["c"].bad[0]
    assert by["d"].bad == ["GPU 1: broken"]
    assert by["e"].slow == ["best link 0.3 GB/s, 30% of the median node's"]
    assert select.judge({"a": report("a", links=(0.5,)), "b": report("b")}, 0.5, min_bandwidth=0.8)[0].slow == [
        "best link 0.5 GB/s, below min_bandwidth 0.8"]


def test_the_job_starts_on_fit_nodes_in_allocation_order_the_fastest_first_and_slow_ones_only_if_needed():
    verdicts = select.judge({"n1": report("n1", compute=90), "n2": report("n2", failed=["health_check: x"]),
                             "n3": report("n3", compute=100), "n4": report("n4", compute=10),
                             "n5": report("n5", compute=95)}, 0.5, None)
    assert [v.host for v in select.choose(verdicts, 2)] == ["n3", "n5"]
    assert [v.host for v in select.choose(verdicts, 3)] == ["n1", "n3", "n5"]
    assert [v.host for v in select.choose(verdicts, 4)] == ["n1", "n3", "n4", "n5"]  # the slow one, needed
    assert select.choose(verdicts, 5) is None  # the bad one never
    # the node running the job script stays allocated anyway: when fit it is used, and a faster spare goes back
    assert [v.host for v in select.choose(verdicts, 2, held="n1")] == ["n1", "n3"]
    assert [v.host for v in select.choose(verdicts, 2, held="n4")] == ["n3", "n5"]  # slow: not used for that
    assert [v.host for v in select.choose(verdicts, 2, held="n2")] == ["n3", "n5"]  # bad: never


def _select(tmp_path, reports: dict, needed: int | str) -> subprocess.CompletedProcess:
    folder = tmp_path / "vet"
    folder.mkdir(exist_ok=True)
    for host, data in reports.items():
        (folder / f"{host}.json").write_text(json.dumps(data))
    (tmp_path / "tasks").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_")}
    return subprocess.run([sys.executable, "-m", "hpc.runtime.vetting.select", str(folder), str(needed),
                           "node1", "node2", "node3"], capture_output=True, text=True, timeout=60,
                          env={**env, "HPC_JOB_DIR": str(tmp_path), "HPC_TASK": "4"})


def test_select_prints_the_hosts_to_start_on_and_notes_the_bad_ones(tmp_path):
    proc = _select(tmp_path, {"node1": report("node1"), "node2": report("node2", failed=["free memory"]),
                              "node3": report("node3")}, 2)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["node1", "node3"]
    assert "hpc: vetting: node node2 excluded: free memory: broken" in proc.stderr
    assert (tmp_path / "tasks" / "4.excluded").read_text() == "node2 vetting: free memory: broken\n"
    short = _select(tmp_path, {}, 2)  # node3's report remains; node1 and node2 reported nothing this time
    assert short.returncode == 0 and short.stdout.split() == ["node1", "node3"]


def test_select_adds_hot_spares_after_the_hosts_to_start_on_fit_ones_only(tmp_path):
    proc = _select(tmp_path, {"node1": report("node1"), "node2": report("node2"), "node3": report("node3")}, "1+1")
    assert proc.returncode == 0 and proc.stdout.split() == ["node1", "node2"], proc.stderr
    assert "hot spare(s) node2" in proc.stderr
    bad = _select(tmp_path, {"node1": report("node1"), "node2": report("node2", failed=["free memory"]),
                             "node3": report("node3")}, "2+1")
    assert bad.returncode == 0 and bad.stdout.split() == ["node1", "node3"]  # no fit node left to spare
    assert _select(tmp_path, {}, "2+x").returncode == 2


def test_select_exits_3_when_too_few_nodes_are_fit(tmp_path):
    proc = _select(tmp_path, {"node1": report("node1"), "node2": report("node2", failed=["GPUs visible"])}, 3)
    assert proc.returncode == 3 and proc.stdout == ""
    assert "1 of 3 nodes fit to run, 3 needed" in proc.stderr
    assert sorted(line.split()[0] for line in (tmp_path / "tasks" / "4.excluded").read_text().splitlines()) == [
        "node2", "node3"]


# --- one node's whole probe ----------------------------------------------------------------------------
def test_a_single_nodes_probe_writes_its_checks_and_measurements(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key in [k for k in os.environ if k.startswith(("HPC_", "SLURM_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURMD_NODENAME", "nodeX")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("HPC_VET_PORT", str(port))
    assert probe.main([str(tmp_path)]) == 0
    data = json.loads((tmp_path / "nodeX.json").read_text())
    assert data["ok"] and data["host"] == "nodeX" and data["compute_gflops"] > 0
    assert data["links_gbps"] == {} and data["allreduce_gbps"] is not None and "network_error" not in data
    assert {c["name"] for c in data["checks"]} >= {"free memory"}


# --- what render refuses -------------------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["-p", "local", "--spare-nodes", "1"], "only a SLURM job allocates nodes to choose from"),
    (["-p", "slurm-local", "-N", "2", "--spare-nodes", "1"], "with vetting off: nothing would choose"),
    (["-p", "slurm-local", "--spare-nodes", "-1"], "--spare-nodes = -1: must not be negative"),
    (["-p", "slurm-local", "--notify", "not a target"], "neither a webhook URL nor an email address")])
def test_spare_nodes_and_notify_are_refused_in_one_line_where_they_cannot_work(in_tmp, args, words):
    (in_tmp / "train.py").write_text("")
    proc = subprocess.run(hpc_cmd("render", *args, "train.py"), cwd=in_tmp, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_status_names_each_excluded_node_once_with_its_first_reason(tmp_path):
    from hpc.cluster.backends.base import LocalFiles, excluded_nodes

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "0.excluded").write_text("node2 vetting: health_check: exit 1\nnode2 vetting: again\n"
                                                   "node7 straggler (2.1x the median)\n")
    (tmp_path / "tasks" / "1.excluded").write_text("node9 vetting: GPU 0: 2 uncorrected ECC errors\n")
    assert excluded_nodes(LocalFiles(tmp_path)) == [
        {"node": "node2", "why": "vetting: health_check: exit 1", "task": "0"},
        {"node": "node7", "why": "straggler (2.1x the median)", "task": "0"},
        {"node": "node9", "why": "vetting: GPU 0: 2 uncorrected ECC errors", "task": "1"}]


def test_hpc_test_lists_each_vetted_node_with_the_jobs_thresholds(tmp_path):
    from hpc.cli.test_cmd import vetting_checks
    from hpc.cluster.backends.base import LocalFiles

    folder = tmp_path / "vetting" / "0" / "0"
    folder.mkdir(parents=True)
    (tmp_path / "runtime.json").write_text(json.dumps({"vetting": {"relative_speed": 0.95}}))
    for host, data in {"node1": report("node1", compute=100), "node2": report("node2", compute=85),
                       "node3": report("node3", failed=["free memory"])}.items():
        (folder / f"{host}.json").write_text(json.dumps(data))
    (folder / "node4.json").write_text("{cut")
    checks = vetting_checks(LocalFiles(tmp_path))
    assert [(c["name"], c["ok"]) for c in checks] == [("node node1", True), ("node node2", False),
                                                      ("node node3", False), ("node node4", False)]
    assert checks[1]["detail"].startswith("compute 85 GFLOP/s, 92% of the median")  # below 0.95 of the median
    assert checks[2]["detail"].startswith("free memory: broken")
    assert vetting_checks(LocalFiles(tmp_path / "unvetted")) == []
