"""hpc.contract.launch_env: every way a process can be started yields the same rank/rendezvous contract."""

import pytest

from hpc.contract.launch_env import detect, export, tasks_on_node
from hpc.errors import HpcError


def test_plain_python_is_a_world_of_one():
    env = detect({})
    assert (env.launcher, env.rank, env.world_size, env.master_addr) == ("single", 0, 1, "127.0.0.1")


def test_srun_task_on_the_second_node():
    env = detect({"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
                  "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
                  "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_STEP_NODELIST": "gpu[07-08]",
                  "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NNODES": "2"})
    assert (env.launcher, env.rank, env.local_rank, env.node_rank, env.world_size) == ("srun", 3, 1, 1, 4)
    assert (env.local_world_size, env.num_nodes, env.master_addr) == (2, 2, "gpu07")
    assert env.master_port == 1234 % 4536 + 61000


def test_existing_master_port_wins():
    env = detect({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
                  "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)", "MASTER_PORT": "29555"})
    assert env.master_port == 29555


def test_torchrun_variables():
    env = detect({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                  "MASTER_ADDR": "n1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "77",
                  "TORCHELASTIC_RESTART_COUNT": "2"})
    assert (env.launcher, env.rank, env.node_rank, env.num_nodes, env.restart_count) == ("torchrun", 5, 1, 2, 2)


def test_submitit_local_task():
    env = detect({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "4242", "SUBMITIT_LOCAL_NTASKS": "2",
                  "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1"})
    assert (env.launcher, env.rank, env.world_size, env.master_addr) == ("submitit", 1, 2, "127.0.0.1")


def test_multi_node_never_falls_back_to_localhost():
    with pytest.raises(HpcError, match="2-node job would rendezvous on 127.0.0.1"):
        detect({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "1"})


@pytest.mark.parametrize("spec, node, n", [("2(x3),1", 0, 2), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1), ("4", 0, 4)])
def test_tasks_per_node(spec, node, n):
    assert tasks_on_node(spec, node) == n


def test_export_fills_only_what_is_missing():
    environ = {"MASTER_PORT": "1111"}
    export(detect({"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
                   "SLURM_JOB_NODELIST": "a1", "SLURM_TASKS_PER_NODE": "2"}), environ)
    assert environ == {"MASTER_PORT": "1111", "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                       "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0", "MASTER_ADDR": "a1"}


def test_in_an_srun_task_slurms_numbers_replace_a_place_left_by_the_submitting_shell():
    slurm = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
             "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "a[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    environ = {"NODE_RANK": "0", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "a1", "MASTER_PORT": "7"}
    export(detect({**slurm, **environ}), environ)
    assert environ == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1",
                       "MASTER_ADDR": "a1", "MASTER_PORT": "7"}
    # under a launcher that set RANK and WORLD_SIZE, its variables are the place, and they stay
    started = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "1", "MASTER_ADDR": "a1",
               "MASTER_PORT": "7"}
    export(detect({**slurm, **started}), after := dict(started))
    assert {k: after[k] for k in started} == started


def test_torchrun_workers_trust_the_address_their_agents_agreed_on():
    # torchrun's rendezvous names the store's host as that host calls itself (localhost on one-machine clusters)
    env = detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "localhost",
                  "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "77", "GROUP_RANK": "1"})
    assert (env.launcher, env.num_nodes, env.node_rank, env.master_addr) == ("torchrun", 2, 1, "localhost")
