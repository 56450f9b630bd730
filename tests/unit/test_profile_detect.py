"""`hpc profile new --detect` and `hpc profile check` against recorded SLURM output: the parsers, the facts, the
profile written from them (each value with its source, unknowns left out) and the differences named. The same
code runs against live clusters in tests/test_profile_detect_slurm.py."""

import os
import subprocess
import sys

import pytest
import yaml

from hpc.cluster.config import detect, live_check, profiles
from hpc.slurm.cluster_facts import gather
from hpc.slurm.commands import (
    Slurm,
    parse_config,
    parse_getent,
    parse_gres,
    parse_ip_addresses,
    parse_records,
)
from tests.unit.test_slurm_recorded import Recorded

# scripts/slurm-local with SLURM_LOCAL_GPUS=2, SLURM_LOCAL_NODES=2 (Slurm 22.05.8), as recorded
LOCAL_PARTITIONS = """\
PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[1-2] PriorityJobFactor=1 PriorityTier=5 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=4 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=4,mem=2000M,node=2,billing=4
PartitionName=lowgrace AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=30 Hidden=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[1-2] PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=REQUEUE State=UP TotalCPUs=4 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=4,mem=2000M,node=2,billing=4
"""  # noqa: E501
LOCAL_NODES = """\
NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.03 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=127.0.0.1 NodeHostName=node1 Port=17201 Version=22.05.8 OS=Linux 6.18.44-fc-v857 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=22899 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug,low,lowgrace,high  BootTime=2026-11-28T07:46:45 SlurmdStartTime=2026-11-28T08:34:23 LastBusyTime=2026-11-28T08:34:23 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=node2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.03 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=127.0.0.1 NodeHostName=node2 Port=17202 Version=22.05.8 OS=Linux 6.18.44-fc-v857 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=22899 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug,low,lowgrace,high  BootTime=2026-11-28T07:46:45 SlurmdStartTime=2026-11-28T08:34:23 LastBusyTime=2026-11-28T08:34:23 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
"""  # noqa: E501
LOCAL_CONFIG = """\
Configuration data as of 2026-11-28T08:34:25
AccountingStorageType   = accounting_storage/none
ClusterName             = local
MaxArraySize            = 1001
PreemptMode             = REQUEUE
PreemptType             = preempt/partition_prio
SelectType              = select/cons_tres
"""
IP_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever preferred_lft forever
5: ib0    inet 10.100.0.7/16 brd 10.100.255.255 scope global ib0\\       valid_lft forever preferred_lft forever
5: ib0    inet6 fe80::1/64 scope link \\       valid_lft forever preferred_lft forever
"""

# a site of Perlmutter's shape: typed GPUs, features, limits, slurmdbd, QOS preemption, node names in DNS
SITE_PARTITIONS = (
    "PartitionName=gpu AllowAccounts=ALL Default=YES QoS=N/A DefaultTime=00:30:00 GraceTime=0 MaxNodes=256 "
    "MaxTime=2-00:00:00 Nodes=nid[001-004] PreemptMode=OFF State=UP TotalNodes=4\n"
    "PartitionName=short AllowAccounts=ALL Default=NO QoS=N/A DefaultTime=NONE GraceTime=0 MaxNodes=UNLIMITED "
    "MaxTime=00:20:00 Nodes=nid[001-004] PreemptMode=OFF State=UP TotalNodes=4\n")
SITE_NODES = "".join(
    f"NodeName=nid00{i} CPUTot=128 AvailableFeatures=gpu,a100,{'hbm80g' if i > 2 else 'hbm40g'} "
    f"ActiveFeatures=gpu,a100 Gres=gpu:a100:4(S:0-1) NodeAddr=nid00{i} RealMemory=256000 "
    f"Partitions=gpu,short Reason=being fixed by ops [root@2026-01-01] State=IDLE\n" for i in range(1, 5))
SITE_CONFIG = ("ClusterName = site\nAccountingStorageType = accounting_storage/slurmdbd\nMaxArraySize = 5001\n"
               "PreemptType = preempt/qos\nPreemptMode = REQUEUE\nSelectType = select/cons_tres\n")
SITE_ANSWERS = [
    (["scontrol", "show", "config"], (0, SITE_CONFIG, "")),
    (["scontrol", "show", "node", "-o"], (0, SITE_NODES, "")),
    (["scontrol", "show", "partition", "-o"], (0, SITE_PARTITIONS, "")),
    (["id", "-un"], (0, "alice\n", "")),
    (["sacctmgr", "-n", "-P", "show", "associations"],
     (0, "m1234||normal,preempt,premium|normal\nm9999|gpu|normal|\nm5555|cpu|normal|\n", "")),
    (["sacctmgr", "-n", "-P", "show", "user"], (0, "m9999\n", "")),
    (["sacctmgr", "-n", "-P", "show", "qos"],
     (0, "normal||cluster|00:00:00\npreempt||requeue|00:05:00\npremium|preempt|cluster|00:00:00\n", "")),
    (["getent", "hosts"], (0, "".join(f"10.100.0.{i}  nid00{i}.site.org nid00{i}\n" for i in range(1, 5)), "")),
    (["ip", "-o", "addr", "show"], (0, IP_ADDR, "")),
]


def local_slurm():
    return Slurm(Recorded([(["scontrol", "show", "config"], (0, LOCAL_CONFIG, "")),
                           (["scontrol", "show", "node", "-o"], (0, LOCAL_NODES, "")),
                           (["scontrol", "show", "partition", "-o"], (0, LOCAL_PARTITIONS, "")),
                           (["ip", "-o", "addr", "show"], (0, IP_ADDR, ""))]), retry_waits=())


def written(facts, name="det", partition=None, **flags):
    """The detected profile's text and the profile it loads as."""
    p = facts.partition(partition)
    text = detect.render("header", [detect.Detected("name", name, ""), *detect.detect(facts, p, **flags)])
    return text, yaml.safe_load(text)


def test_parsers_read_what_slurm_prints():
    node = parse_records(LOCAL_NODES)[0]
    assert (node["Gres"], node["NodeAddr"], node["RealMemory"]) == ("gpu:2", "127.0.0.1", "1000")
    assert node["OS"] == "Linux 6.18.44-fc-v857 #1 SMP PREEMPT_DYNAMIC @0"  # free text with spaces stays whole
    site = parse_records(SITE_NODES)[0]
    assert site["Reason"] == "being fixed by ops [root@2026-01-01]" and site["State"] == "IDLE"
    assert parse_gres("gpu:a100:4(S:0-1),nic:1") == {"gpu": ("a100", 4), "nic": (None, 1)}
    assert parse_gres("gpu:a100:2,gpu:v100:2") == {"gpu": (None, 4)}  # two types: no one type
    assert parse_gres("(null)") == {} and parse_gres("gpu:2(IDX:0-1)") == {"gpu": (None, 2)}
    assert parse_config(LOCAL_CONFIG)["PreemptType"] == "preempt/partition_prio"
    assert parse_ip_addresses(IP_ADDR) == [("lo", "127.0.0.1/8"), ("eth0", "192.0.2.2/24"), ("ib0", "10.100.0.7/16"),
                                           ("ib0", "fe80::1/64")]
    assert parse_getent("10.0.0.1  nid001.site.org nid001\n10.0.0.3  other.org\n", ["nid001", "nid003"]) \
        == {"nid001": "10.0.0.1"}  # an answer that names none of the hosts asked is not guessed


def test_the_local_cluster_detected_with_its_gpus_and_its_preemption():
    facts = gather(local_slurm())
    assert facts.access is None  # no slurmdbd: sacctmgr is never asked (Recorded would refuse it)
    text, data = written(facts)
    assert data == {"name": "det", "partition": "debug", "max_nodes": 2, "max_array_size": 1001, "gpus_per_node": 2,
                    "cpus_per_task": 1, "network_interface": "lo"}
    assert "# the cluster's default partition (Default=YES)\npartition: debug" in text
    assert "PreemptMode=OFF GraceTime=0: jobs here are not preempted" in text
    assert "max_time" not in data and "default_time" not in data  # MaxTime=UNLIMITED, DefaultTime=NONE: left out
    _, grace = written(gather(local_slurm(), "lowgrace"), partition="lowgrace")
    assert grace["preemption"] == {"lead_time": 30} and grace["partition"] == "lowgrace"
    _, one = written(facts, gpus_per_node=1)
    assert one["cpus_per_task"] == 2  # the node's CPUs shared by the GPUs the user asks for


def test_a_site_with_accounting_typed_gpus_features_and_limits(tmp_path):
    slurm = Slurm(Recorded(SITE_ANSWERS), retry_waits=())
    facts = gather(slurm)
    text, data = written(facts)
    assert data == {"name": "det", "partition": "gpu", "account": "m9999", "qos": "normal", "constraint": "a100&gpu",
                    "max_nodes": 4, "max_array_size": 5001, "gpus_per_node": 4, "gpu_type": "a100",
                    "cpus_per_task": 32, "default_time": "00:30:00", "max_time": "2-00:00:00",
                    "network_interface": "ib0"}
    assert "also allowed: m1234" in text and "m5555" not in text  # m5555's association is for another partition
    assert "some nodes also have: hbm40g, hbm80g" in text
    assert "QOS normal (sacctmgr show qos): no QOS preempts it" in text
    _, preemptible = written(facts, qos="preempt")  # the QOS "premium" preempts, with 5 minutes' grace
    assert preemptible["preemption"] == {"lead_time": 300}
    assert ["sacctmgr", "-n", "-P", "show", "associations", "where", "user=alice",
            "format=Account,Partition,QOS,DefaultQOS"] in slurm.run.calls
    path = tmp_path / "det.yaml"
    path.write_text(text)
    prof, _, _ = profiles.load(str(path))  # what is written validates
    assert live_check.differences(prof, facts) == []
    short = gather(Slurm(Recorded(SITE_ANSWERS), retry_waits=()), "short")
    _, data = written(short, partition="short")
    # no DefaultTime and a MaxTime below hpc's default: SLURM's own default (MaxTime) is written
    assert (data["default_time"], data["max_time"], data["max_nodes"]) == ("00:20:00", "00:20:00", 4)


def test_each_difference_from_the_live_cluster_is_one_line(tmp_path):
    facts = gather(Slurm(Recorded(SITE_ANSWERS), retry_waits=()))
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({
        "partition": "gpu", "max_nodes": 512, "max_time": "3-00:00:00", "gpus_per_node": 8, "gpu_type": "h100",
        "cpus_per_task": 64, "constraint": "gpu&hbm80g|h100", "account": "m0000", "qos": "debug",
        "max_array_size": 10000, "preemption": {"lead_time": 600}}))
    prof, _, _ = profiles.load(str(path))
    found = live_check.differences(prof, facts)
    assert found == [
        "max_nodes 512 exceeds partition gpu's 4 (TotalNodes=4)",
        "max_time 3-00:00:00 exceeds partition gpu's MaxTime 2-00:00:00",
        "gpus_per_node 8: the nodes of partition gpu have 4 (GRES gpu)",
        "gpu_type h100: the GPUs of partition gpu are a100",
        "cpus_per_task 64 x 8 processes per node exceeds the 128 CPUs of partition gpu's smallest node",
        "constraint gpu&hbm80g|h100: no node of partition gpu has h100 (features: a100, gpu, hbm40g, hbm80g)",
        "max_array_size 10000 exceeds the cluster's MaxArraySize 5001",
        "account m0000 is not one alice may use on gpu (m9999, m1234)",
        "qos debug is not one alice may use on gpu (normal, preempt, premium)",
    ]
    path.write_text("partition: gone\n")
    assert live_check.differences(profiles.load(str(path))[0], facts) == [
        "partition gone no longer exists (partitions: gpu, short)"]
    grace = gather(local_slurm(), "lowgrace")
    path.write_text("partition: lowgrace\npreemption: {lead_time: 120}\n")
    assert live_check.differences(profiles.load(str(path))[0], grace) == [
        "preemption.lead_time 120 s is longer than partition lowgrace's GraceTime 30 s: a save that needs the lead "
        "time is cut off when the job is preempted"]


@pytest.fixture
def cli_on_site(monkeypatch, in_tmp):
    """`hpc profile ...` in this process, its SLURM answered from SITE_ANSWERS."""
    from click.testing import CliRunner

    from hpc.cluster.config import detect

    calls = []

    def recorded(remote):
        slurm = Slurm(Recorded(SITE_ANSWERS), retry_waits=())
        calls.append(remote)
        return slurm, "recorded"

    monkeypatch.setattr(detect, "live_slurm", recorded)

    def run(*args, input=None):
        from hpc.cli import cli

        return CliRunner().invoke(cli, list(args), input=input)

    run.calls = calls
    return run


def test_flags_win_over_what_is_detected_and_say_so(cli_on_site):
    result = cli_on_site("profile", "new", "det", "--detect", "-y", "--partition", "short", "--qos", "premium",
                         "--gpus-per-node", "2", "--lead-time", "60", "--modules", "cuda,nccl")
    assert result.exit_code == 0, result.output
    text = open("cluster_configs/det.yaml").read()
    data = yaml.safe_load(text)
    assert (data["partition"], data["qos"], data["gpus_per_node"], data["cpus_per_task"]) == \
        ("short", "premium", 2, 64)
    # m9999, alice's default account, is for partition gpu only
    assert data["account"] == "m1234" and "the default, m9999, is not one" in text
    assert data["preemption"] == {"lead_time": 60} and data["modules"] == ["cuda", "nccl"]
    assert "# --qos; the cluster says normal" in text and "launcher" not in data  # -y: unknowns stay out
    again = cli_on_site("profile", "new", "det", "--detect", "-y")
    assert again.exit_code != 0 and "already exists" in str(again.exception)
    asked = cli_on_site("profile", "new", "asked", "--detect", input="cuda\ntorchrun\nUSR2\n90\n")
    assert asked.exit_code == 0, asked.output
    data = yaml.safe_load(open("cluster_configs/asked.yaml").read())
    assert (data["modules"], data["launcher"], data["preemption"]) == (["cuda"], "torchrun",
                                                                       {"signal": "USR2", "lead_time": 90})


def test_check_names_differences_and_exits_2(cli_on_site):
    os.makedirs("cluster_configs")
    with open("cluster_configs/old.yaml", "w") as f:
        f.write("partition: gone\n")
    result = cli_on_site("profile", "check", "old")
    assert "old: partition gone no longer exists" in result.output
    assert "does not fit the cluster: 1 difference" in str(result.exception)
    with open("cluster_configs/fine.yaml", "w") as f:
        f.write("partition: gpu\ngpus_per_node: 4\n")
    ok = cli_on_site("profile", "validate", "--live", "fine")
    assert ok.exit_code == 0 and "ok: fine fits the cluster recorded (partition gpu)" in ok.output, ok.output


def _hpc(*args, cwd):
    return subprocess.run([sys.executable, "-m", "hpc", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf"})


def test_flag_errors_fit_the_command(in_tmp):
    cut_short = _hpc("profile", "new", "x", "--gpus", "4", cwd=in_tmp)
    assert cut_short.returncode == 2 and "--gpus-per-node" in cut_short.stderr
    assert "script's own arguments" not in cut_short.stderr and cut_short.stderr.count("\n") == 1
    script = _hpc("render", "-p", "slurm-local", "--lr", "3", "train.py", cwd=in_tmp)
    assert script.returncode == 2 and "The script's own arguments go after '--'" in script.stderr
    local = _hpc("profile", "new", "x", "--detect", "--scheduler", "local", "-y", cwd=in_tmp)
    assert local.returncode == 2 and "nothing to detect" in local.stderr


def test_the_new_flags_work_without_detect_too(in_tmp):
    proc = _hpc("profile", "new", "plain", "--qos", "debug", "--max-nodes", "8", "--constraint", "gpu", "-y",
                cwd=in_tmp)
    assert proc.returncode == 0, proc.stderr
    prof, _, _ = profiles.load(str(in_tmp / "cluster_configs" / "plain.yaml"))
    assert (prof.qos, prof.max_nodes, prof.constraint) == ("debug", 8, "gpu")
    remote = _hpc("profile", "new", "x", "--remote", "slurm-local-ssh", "-y", cwd=in_tmp)
    assert remote.returncode == 2 and "add --detect" in remote.stderr
