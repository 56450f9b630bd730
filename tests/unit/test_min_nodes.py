"""min_nodes: the key's checks (1..nodes, and none of the keys that decide the nodes otherwise), and what the
rendered batch script does with it: each attempt counts the nodes SLURM gave it, and a requeue that cannot have N
nodes asks for MIN to N. The live run (a node lost, the job finishing on fewer) is tests/test_min_nodes_slurm.py."""

import subprocess

import pytest

from hpc.cluster import backends
from hpc.cluster.config import precedence as p
from hpc.cluster.render import render
from hpc.errors import HpcError
from tests.conftest import hpc_cmd


def _render(profile: str, **flags):
    effective = p.resolve(profile, [p.flag_layer({"script": "train.py", **flags})])
    return render(effective, "/scratch/jobs/m", backend=backends.for_profile(effective.profile))


@pytest.mark.parametrize("flags, words", [
    ({"nodes": 2, "min_nodes": 0}, "min-nodes = 0: must be at least 1"),
    ({"nodes": 2, "min_nodes": 3}, "min-nodes = 3: exceeds the job's 2 node(s)"),
    ({"launcher": "torchrun", "elastic": "1:3", "min_nodes": 1}, "cannot be combined with --elastic 1:3"),
    ({"nodes": 2, "spare_nodes": 1, "vet": True, "min_nodes": 1}, "cannot be combined with spare_nodes 1"),
    ({"nodes": 2, "nodelist": "node[1-2]", "min_nodes": 1}, "cannot be combined with nodelist node[1-2]"),
    ({"nodes": 2, "min_nodes": 1, "env": {"PARALLELISM_CONFIG_DP_SHARD_SIZE": "4"}},
     "with min_nodes 1: a mesh has a fixed number of ranks"),
])
def test_min_nodes_is_refused_where_it_makes_no_sense(in_tmp, flags, words):
    with pytest.raises(HpcError) as e:
        _render("slurm-local", **flags)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert e.value.fix


def test_min_nodes_equal_to_nodes_changes_nothing(in_tmp):
    """min_nodes = nodes is the job without it (and lets a job file turn a profile's min_nodes off)."""
    plain, same = _render("slurm-local", nodes=2), _render("slurm-local", nodes=2, min_nodes=2)
    assert plain.script.replace("/m", "") == same.script.replace("/m", "")
    assert same.runtime_config["min_nodes"] is None
    # one meaning in the code: a resolved min_nodes is below nodes, or None; --explain says why it went
    assert same.effective.job.min_nodes is None
    assert same.effective.sources["min_nodes"] == "dropped (flag (--min-nodes): 2 = nodes, runs on exactly those)"
    # and so with the keys it would conflict with
    _render("slurm-local", launcher="torchrun", elastic="1:2", min_nodes=2)


def test_a_profiles_min_nodes_is_the_jobs_default(in_tmp):
    (in_tmp / "shrinks.yaml").write_text("name: shrinks\nextends: slurm-local\nmin_nodes: 1\n")
    job = _render(str(in_tmp / "shrinks.yaml"), nodes=3)
    assert job.runtime_config["min_nodes"] == 1
    assert "NumNodes=1-3" in job.script


@pytest.mark.parametrize("launcher, words", [
    ("srun", ['srun "${step_nodes[@]}" ', "export WORLD_SIZE=$((nnodes * 2))"]),
    ("torchrun", ['srun "${step_nodes[@]}" ', '--nnodes="$nnodes"']),
    ("deepspeed", ['--num_nodes="$nnodes"', 'scontrol show hostnames "$SLURM_JOB_NODELIST"']),
])
def test_each_launcher_runs_an_attempt_on_the_nodes_slurm_gave_it(in_tmp, launcher, words):
    script = _render("slurm-local", nodes=3, min_nodes=1, launcher=launcher).script
    assert "nnodes=$((SLURM_JOB_NUM_NODES < 3 ? SLURM_JOB_NUM_NODES : 3))" in script
    assert 'echo "hpc: this attempt runs on $nnodes of the job\'s 3 nodes (min_nodes 1)" >&2' in script
    for w in words:
        assert w in script, w
    assert "WORLD_SIZE=6" not in script and "--nnodes=3" not in script and "--num_nodes=3" not in script
    # the requeue: MIN to N with MIN's tasks and CPUs, only once fewer than N are left; below MIN it ends FAILED
    assert 'if ! left=$(room) || [ "$left" -ge 3 ]; then' in script
    assert 'NumNodes=1-3 NumTasks="$tasks"' in script and "local tasks=$((1 * " in script
    assert "fewer than the 1 the job can run on" in script


def test_vetting_chooses_this_attempts_nodes(in_tmp):
    script = _render("slurm-local", nodes=3, min_nodes=2, vet=True, launcher="torchrun").script
    assert 'vetting.select "$vet_dir" "$nnodes" "${allocated[@]}"' in script
    assert 'step_nodes=(--nodes="$nnodes" --ntasks=$((nnodes * 1)) --nodelist=' in script
    assert 'echo "vetting: fewer than $nnodes nodes fit to run" > "$HPC_REQUEUE_FILE"' in script


def test_the_flag_is_refused_in_one_line_and_exit_2(in_tmp):
    (in_tmp / "train.py").write_text("")
    proc = subprocess.run(hpc_cmd("render", "-p", "slurm-local", "-N", "2", "--min-nodes", "3", "train.py"),
                          cwd=in_tmp, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--min-nodes = 3: exceeds the job's 2 node(s)" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
