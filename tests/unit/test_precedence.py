import pytest

from hpc.cluster.config import precedence as p
from hpc.cluster.config import scheduler_keys
from hpc.errors import ConfigError, HpcError


def resolve(profile="slurm-local", flags=None, env=None, job_file=None, sets=None):
    layers = []
    if job_file:
        layers.append(p.job_file_layer(job_file))
    layers.append(p.env_layer(env or {}))
    if sets:
        layers.append(p.set_layer(sets))
    layers.append(p.flag_layer({"script": "train.py", **(flags or {})}))
    return p.resolve(profile, layers)


def test_each_layer_beats_the_one_below(in_tmp):
    jf = in_tmp / "job.yaml"
    jf.write_text("time: '00:20:00'\nnodes: 2\naccount: fromfile\ncpus_per_task: 2\n")
    eff = resolve(job_file=jf, env={"HPC_TIME": "00:30:00", "HPC_NODES": "3"}, flags={"time": "00:40:00"})
    job, src = eff.job, eff.sources
    assert (job.time, src["time"]) == ("00:40:00", "flag (--time)")                      # flag > env
    assert (job.nodes, src["nodes"]) == (3, "env (HPC_NODES)")                           # env > job file
    assert (job.account, src["account"]) == ("fromfile", f"job file {jf}")             # job file > profile
    assert (job.cpus_per_task, src["cpus_per_task"]) == (2, f"job file {jf}")
    assert (job.partition, src["partition"]) == ("debug", "profile slurm-local.yaml")    # profile > default
    assert (job.max_restarts, eff.sources.get("max_restarts", "default")) == (0, "default")


def test_set_sits_below_explicit_flags(in_tmp):
    eff = resolve(sets=["nodes=2", "qos=high"], flags={"nodes": 3})
    assert (eff.job.nodes, eff.job.qos) == (3, "high")
    assert eff.sources["qos"] == "--set (--set qos)"


def test_explain_lists_every_key_with_its_source(in_tmp):
    rows = resolve().explain_rows()
    keys = [r[0] for r in rows]
    assert "nodes" in keys and "partition" in keys and len(keys) == len(set(keys))
    assert dict((r[0], r[2]) for r in rows)["ntasks_per_node"].startswith("derived")


def test_mem_set_higher_up_drops_the_profiles_mem_per_gpu(in_tmp):
    (in_tmp / "cluster_configs").mkdir()
    (in_tmp / "cluster_configs" / "g.yaml").write_text("mem_per_gpu: 40G\ngpus_per_node: 4\n")
    eff = resolve("g", flags={"mem": "100G"})
    assert (eff.job.mem, eff.job.mem_per_gpu) == ("100G", None)


@pytest.mark.parametrize("profile, flags, derived", [
    ("slurm-local", {}, (2, 2)),                                   # CPU slots from the profile
    ("slurm-local", {"launcher": "torchrun"}, (1, 2)),             # one agent per node
    ("perlmutter", {}, (4, 4)),                                    # one task per GPU
    ("perlmutter", {"launcher": "torchrun"}, (1, 4)),
    ("local", {"nproc_per_node": 3}, (3, 3)),
])
def test_tasks_and_processes_per_node(in_tmp, profile, flags, derived):
    job = resolve(profile, flags=flags).job
    assert (job.ntasks_per_node, job.nproc_per_node) == derived


def test_elastic_defaults_nodes_to_max(in_tmp):
    job = resolve(flags={"launcher": "torchrun", "elastic": "1:3"}).job
    assert job.nodes == 3


@pytest.mark.parametrize("flags, env, key, problem", [
    ({"nodes": 9}, {}, "--nodes", "max_nodes 3"),
    ({"time": "2:00:00"}, {}, "--time", "max_time"),
    ({}, {"HPC_TIME": "2-00:00:00"}, "HPC_TIME", "max_time"),
    ({"elastic": "1:2"}, {}, "--elastic", "needs the torchrun launcher"),
    ({"launcher": "torchrun", "elastic": "2:3", "nodes": 1}, {}, "--nodes", "outside the elastic range"),
    ({"array": "0-3", "sweep": "s.yaml"}, {}, "--sweep", "cannot be combined"),
    ({"nproc_per_node": 3, "ntasks_per_node": 2}, {}, "--nproc-per-node", "srun starts one process per task"),
    ({"job_name": "x`id`"}, {}, "--job-name", "not a safe job name"),
    ({"job_name": "a\nb"}, {}, "--job-name", "not a safe job name"),
    ({"args": ["a\nb"]}, {}, "ARGS", "one line"),
    ({"module": "m"}, {}, "--module", "cannot be combined with script"),
])
def test_rules_between_keys_name_the_key(in_tmp, flags, env, key, problem):
    with pytest.raises(ConfigError) as err:
        resolve(flags=flags, env=env)
    assert err.value.key == key and problem in str(err.value)


def test_local_profile_is_one_node(in_tmp):
    with pytest.raises(ConfigError, match="max_nodes 1"):
        resolve("local", flags={"nodes": 2})


def test_job_file_unknown_key(in_tmp):
    jf = in_tmp / "job.yaml"
    jf.write_text("nodse: 2\n")
    with pytest.raises(ConfigError, match="job.yaml: nodse = 2: unknown key; fix: did you mean 'nodes'"):
        resolve(job_file=jf)


# --- what a scheduler takes: precedence asks the profile's scheduler and names where the key was set ------------
def test_precedence_asks_the_profiles_scheduler_what_it_takes(in_tmp, monkeypatch):
    asked = []

    def refused_key(job, profile):
        asked.append(profile.name)
        return ("nodes", "is odd on this cluster", "ask for an even number") if job.nodes % 2 else None

    monkeypatch.setitem(scheduler_keys._RULES, "slurm", refused_key)
    assert resolve(flags={"nodes": 2}).job.nodes == 2
    with pytest.raises(ConfigError) as err:
        resolve(env={"HPC_NODES": "3"})
    assert str(err.value) == "environment: HPC_NODES = 3: is odd on this cluster; fix: ask for an even number"
    assert asked == ["slurm-local"] * 2


def test_a_remote_profile_must_be_slurm_before_anything_is_planned(in_tmp):
    (in_tmp / "odd.yaml").write_text("name: odd\nscheduler: local\nremote: {host: login1, job_root: /scratch/j}\n")
    with pytest.raises(HpcError, match="profile odd: remote needs scheduler slurm"):
        resolve(str(in_tmp / "odd.yaml"))


def test_each_scheduler_keeps_its_own_limits(in_tmp):
    with pytest.raises(ConfigError, match="MaxArraySize 1001") as err:
        resolve(flags={"array": "0-2000"})  # SLURM's array size, named where it was set
    assert err.value.source == "command line"
    with pytest.raises(ConfigError, match="more processes than this machine") as err:
        resolve("local", env={"HPC_NPROC_PER_NODE": "1000000"})
    assert err.value.source == "environment"
    # a SLURM job's processes start on its nodes: this machine's process cap is not asked
    assert resolve(flags={"nproc_per_node": 1000, "launcher": "torchrun"}).job.nproc_per_node == 1000
