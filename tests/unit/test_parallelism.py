"""ParallelismConfig's names, defaults and checks (Accelerate's), the tensor-parallel plan, and what is refused in
one line (the meshes themselves train in tests/test_nd_parallel.py)."""

import json
import subprocess
import sys

import pytest
import torch
import transformers

from hpc import ParallelismConfig
from hpc.errors import HpcError
from hpc.runtime import settings_resolver
from hpc.runtime.parallel import tensor_parallel
from hpc.utils import TorchTensorParallelConfig, TorchTensorParallelPlugin


def one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_accelerates_names_and_joint_dimensions():
    c = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2)
    assert (c.total_size, c.data_parallel_size, c.non_data_parallel_size) == (8, 4, 2)
    assert c.dp_dim_names == ["dp_replicate", "dp_shard"] and c.non_dp_dim_names == ["tp"]
    assert c.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"] and c.dp_shard_cp_dim_names == ["dp_shard"]
    assert c.active_mesh_dims == ["dp_replicate", "dp_shard", "tp"]
    assert isinstance(c.tp_handler, TorchTensorParallelConfig) and c.cp_handler is None


def test_sizes_left_unset_come_from_accelerates_launcher_variables(monkeypatch):
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4")
    c = ParallelismConfig()
    assert (c.tp_size, c.dp_shard_size, c.dp_replicate_size, c.cp_size) == (2, 4, 1, 1)
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "two")
    with pytest.raises(HpcError) as e:
        ParallelismConfig()
    assert "PARALLELISM_CONFIG_TP_SIZE='two'" in one_line(e)


@pytest.mark.parametrize("kwargs,words", [
    ({"tp_size": 0}, "tp_size=0"),
    ({"dp_replicate_size": 2, "tp_size": 2}, "pure data parallelism"),
    ({"dp_shard_size": True}, "dp_shard_size=True"),
])
def test_bad_sizes_are_one_line(kwargs, words):
    with pytest.raises(HpcError) as e:
        ParallelismConfig(**kwargs)
    assert words in one_line(e)


def test_the_sizes_must_make_the_jobs_ranks():
    c = ParallelismConfig(tp_size=2, dp_shard_size=2)
    with pytest.raises(HpcError) as e:
        c.fit(8)
    assert "dp_shard 2 x tp 2 needs 4 processes; the job has 8" in one_line(e)
    plain = ParallelismConfig()
    plain.fit(4)  # all sizes 1: plain data parallelism over the job, as Accelerate's
    assert plain.dp_replicate_size == 4


def test_a_torch_tp_plugin_shards_the_rest_with_fsdp():
    plugin = TorchTensorParallelPlugin(tp_size=2, tp_plan={"x": "colwise"})
    config, plan = settings_resolver.parallelism_of(None, plugin)
    config.fit(8)
    assert (config.tp_size, config.dp_shard_size) == (2, 4) and plan == {"x": "colwise"}


def test_what_needs_no_mesh_is_left_to_ddp_and_sequence_parallelism_is_refused():
    assert settings_resolver.parallelism_of(ParallelismConfig(dp_replicate_size=4), None) == (None, None)
    config = ParallelismConfig(cp_size=2)
    assert settings_resolver.parallelism_of(config, None) == (config, None)  # context parallelism alone needs the mesh
    with pytest.raises(HpcError) as e:
        settings_resolver.parallelism_of(ParallelismConfig(sp_size=2, dp_shard_size=2), None)
    assert "sequence parallelism (DeepSpeed's Ulysses) is not built" in one_line(e) and "cp_size=2" in one_line(e)


def tiny_llama(heads=4, kv=2):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=heads, num_key_value_heads=kv, vocab_size=128)
    return transformers.LlamaForCausalLM(config)


def test_a_transformers_model_carries_its_plan_with_full_paths():
    plan = tensor_parallel.model_plan(tiny_llama())
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise" and plan["lm_head"] == "colwise_gather_output"
    styles = tensor_parallel.resolve(tiny_llama(), plan, 2)
    assert "model.layers.1.mlp.down_proj" in styles and len(styles) == 2 + 2 * 7


def test_a_plan_hpc_cannot_apply_is_one_line():
    with pytest.raises(HpcError) as e:
        tensor_parallel.resolve(tiny_llama(), {"model.layers.*.mlp.up_proj": "sequence_parallel"}, 2)
    assert "style 'sequence_parallel'" in one_line(e)
    with pytest.raises(HpcError) as e:
        tensor_parallel.resolve(tiny_llama(), {"nothing.*": "colwise"}, 2)
    assert "names a module" in one_line(e)
    with pytest.raises(HpcError) as e:
        tensor_parallel.resolve(torch.nn.Sequential(torch.nn.Linear(6, 3)), {"0": "colwise"}, 2)
    assert "does not divide into 2" in one_line(e)


# --- the login side: Accelerate's flags and config keys, checked before anything is queued ------------------
def render(tmp_path, *args):
    from tests.unit.test_accelerate_compat import hpc

    (tmp_path / "t.py").write_text("")
    return hpc(tmp_path, "render", "-p", "slurm-local", "-N", "2", "--nproc", "2", *args, "t.py")


def test_accelerates_parallelism_flags_reach_every_process(tmp_path):
    done = render(tmp_path, "--parallelism_config_tp_size", "2", "--parallelism-config-dp-shard-size", "2")
    assert done.returncode == 0, done.stderr
    for line in ("export PARALLELISM_CONFIG_TP_SIZE=2", "export PARALLELISM_CONFIG_DP_SHARD_SIZE=2",
                 "export ACCELERATE_USE_PARALLELISM_CONFIG=true"):
        assert line in done.stdout


def test_an_accelerate_config_files_parallelism_section_is_read(tmp_path):
    (tmp_path / "acc.yaml").write_text("distributed_type: FSDP\nparallelism_config:\n"
                                       "  parallelism_config_dp_shard_size: 2\n  parallelism_config_tp_size: 2\n")
    done = render(tmp_path, "--config_file", str(tmp_path / "acc.yaml"))
    assert done.returncode == 0, done.stderr
    assert "export PARALLELISM_CONFIG_TP_SIZE=2" in done.stdout


def test_accelerates_context_parallel_flags_reach_every_process(tmp_path):
    done = render(tmp_path, "--parallelism_config_cp_size", "2", "--parallelism-config-dp-shard-size", "2",
                  "--parallelism_config_cp_comm_strategy", "alltoall", "--parallelism_config_cp_backend", "torch",
                  "--parallelism_config_sp_size", "1")
    assert done.returncode == 0, done.stderr
    for line in ("export PARALLELISM_CONFIG_CP_SIZE=2", "export PARALLELISM_CONFIG_DP_SHARD_SIZE=2",
                 "export PARALLELISM_CONFIG_CP_COMM_STRATEGY=alltoall", "export PARALLELISM_CONFIG_CP_BACKEND=torch",
                 "export ACCELERATE_USE_PARALLELISM_CONFIG=true"):
        assert line in done.stdout
    assert "PARALLELISM_CONFIG_SP_SIZE" not in done.stdout and "hpc: note" not in done.stderr


def cp_config(tmp_path, cp_size):
    (tmp_path / "acc.yaml").write_text(
        "distributed_type: FSDP\nparallelism_config:\n  parallelism_config_dp_shard_size: 2\n"
        f"  parallelism_config_cp_size: {cp_size}\n  parallelism_config_cp_comm_strategy: allgather\n"
        "  parallelism_config_sp_backend: deepspeed\n")
    return str(tmp_path / "acc.yaml")


def test_a_config_files_context_parallel_keys_are_read_and_its_sequence_parallel_keys_noted(tmp_path):
    done = render(tmp_path, "--config_file", cp_config(tmp_path, 2))
    assert done.returncode == 0, done.stderr
    assert ("export PARALLELISM_CONFIG_CP_SIZE=2" in done.stdout
            and "export PARALLELISM_CONFIG_CP_COMM_STRATEGY=allgather" in done.stdout)
    assert "parallelism_config.parallelism_config_sp_backend=deepspeed: not used by hpc" in done.stderr


@pytest.mark.parametrize("nodes,nproc,words", [
    ("2", "2", None),  # dp_shard 2 x cp 2: the job's 4 processes
    ("1", "2", "dp_shard 2 x cp 2 needs 4 processes; the job has 2 (1 node(s) x 2)"),
    ("4", "1", "tp x cp = 2 does not divide a node's 1 processes"),
])
def test_submit_dry_run_checks_a_config_files_cp_size_against_the_jobs_processes(tmp_path, nodes, nproc, words):
    from tests.unit.test_accelerate_compat import hpc

    (tmp_path / "t.py").write_text("")
    (tmp_path / "cluster_configs").mkdir()  # slurm-local's max_nodes is the on-machine cluster's 3
    (tmp_path / "cluster_configs" / "wide.yaml").write_text("extends: slurm-local\nmax_nodes: 8\n")
    done = hpc(tmp_path, "submit", "--dry-run", "-p", "wide", "-N", nodes, "--nproc", nproc,
               "--config_file", cp_config(tmp_path, 2), "t.py")
    if words is None:
        assert done.returncode == 0 and "export PARALLELISM_CONFIG_CP_SIZE=2" in done.stdout, done.stderr
    else:
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        assert done.returncode == 2 and len(errors) == 1 and words in errors[0], done.stderr


@pytest.mark.parametrize("args,words", [
    (["--parallelism_config_tp_size", "4"], "tp x cp = 4 does not divide a node's 2 processes"),
    (["--parallelism_config_tp_size", "2"], "tp 2 needs 2 processes; the job has 4 (2 node(s) x 2)"),
    (["--parallelism_config_cp_size", "4"], "tp x cp = 4 does not divide a node's 2 processes"),
    (["--parallelism_config_cp_size", "2", "--parallelism_config_tp_size", "2"], "cp 2 x tp 2: tp x cp = 4"),
    (["--parallelism_config_cp_size", "0"], "must be 1 or more"),
    (["--parallelism_config_cp_comm_strategy", "ring"], "is not a strategy torch's context parallelism has; "
                                                        "fix: use allgather or alltoall"),
    (["--parallelism_config_cp_backend", "deepspeed"], "fix: use torch"),
    (["--parallelism_config_sp_size", "2"], "sequence parallelism (DeepSpeed Ulysses) is not built into hpc; "
                                            "fix: use --parallelism_config_cp_size 2 instead"),
    (["--use_megatron_lm", "--megatron_lm_tp_degree", "2", "--megatron_lm_pp_degree", "3"],
     "Megatron-LM tp_degree 2 x pp_degree 3 does not divide the job's 4 processes"),
    (["--use_megatron_lm", "--megatron_lm_tp_degree", "4"], "Megatron-LM tp_degree 4 does not divide a node's 2"),
    (["--use_megatron_lm", "--megatron_lm_pipeline_schedule", "zigzag"], "is not a pipeline schedule hpc runs"),
    (["--parallelism_config_tp_size", "0"], "must be 1 or more"),
    (["--parallelism_config_cp_size", "2", "--parallelism_config_dp_replicate_size", "2"],
     "cannot be composed with pure data parallelism"),  # as the runtime would refuse it, before the queue
])
def test_sizes_that_do_not_fit_the_job_are_one_line_before_anything_is_queued(tmp_path, args, words):
    done = render(tmp_path, *args)
    assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


# --- sizing: hpc estimate-memory with a mesh -----------------------------------------------------------------
def test_estimate_memory_per_rank_under_a_mesh():
    from hpc.cluster import estimate as est

    shape = est.Shape(batch_size=1, seq_len=4096, hidden_size=4096, layers=32, heads=32)
    plain = est.estimate(8 * 10**9, "fsdp", precision="bf16", world_size=16, shape=shape)
    tp = est.estimate(8 * 10**9, "fsdp", precision="bf16", world_size=16, shape=shape, tp=4)
    hsdp = est.estimate(8 * 10**9, "fsdp", precision="bf16", world_size=16, shape=shape, tp=4, dp_replicate=2)
    # tp x dp_shard still cuts the state 16 ways; HSDP's replicas hold the same shards: 8 ways
    assert tp.state_bytes == plain.state_bytes and hsdp.state_bytes == 2 * plain.state_bytes
    # tp cuts the matmuls' activations (24 + 5as/h of the 34 + 5as/h a layer), not the norms' and dropouts'
    per_layer = lambda t: 1 * 4096 * 4096 * (10 + 24 / t + 5 * 32 * 4096 / 4096 / t)  # noqa: E731
    assert tp.activations == int(per_layer(4) * 32) and plain.activations == int(per_layer(1) * 32)
    assert tp.strategy == "fsdp (tp 4)" and hsdp.strategy == "fsdp (tp 4, replicate 2)"
    with pytest.raises(HpcError, match="composes with FSDP2 only"):
        est.estimate(10**9, "zero3", world_size=8, tp=2)
    with pytest.raises(HpcError, match="does not divide 6"):
        est.estimate(10**9, "fsdp", world_size=6, tp=4)


def test_estimate_memory_per_rank_under_context_parallelism():
    from hpc.cluster import estimate as est

    shape = est.Shape(batch_size=1, seq_len=32768, hidden_size=4096, layers=32, heads=32)
    plain = est.estimate(8 * 10**9, "fsdp", precision="bf16", world_size=16, shape=shape)
    cp2 = est.estimate(8 * 10**9, "fsdp", precision="bf16", world_size=16, shape=shape, cp=2)
    cp4 = est.estimate(8 * 10**9, "fsdp", precision="bf16", world_size=16, shape=shape, cp=4)
    # the sequence is cut in cp parts: each rank keeps its part's activations, the attention term included
    assert cp2.activations * 2 == plain.activations and cp4.activations * 4 == plain.activations
    # cp's ranks are in FSDP's shard group (dp_shard x cp): the state per rank is plain FSDP's over 16 ranks
    assert (cp2.params, cp2.grads, cp2.optimizer) == (plain.params, plain.grads, plain.optimizer)
    both = est.estimate(8 * 10**9, "fsdp", precision="bf16", world_size=16, shape=shape, tp=2, cp=2)
    tp = est.estimate(8 * 10**9, "fsdp", precision="bf16", world_size=16, shape=shape, tp=2)
    assert both.state_bytes == plain.state_bytes and both.activations * 2 == tp.activations
    checkpointed = est.Shape(1, 32768, 4096, 32, 32, checkpointing=True)
    assert (est.estimate(10**9, "fsdp", world_size=8, shape=checkpointed, cp=2).activations * 2
            == est.estimate(10**9, "fsdp", world_size=8, shape=checkpointed).activations)
    assert cp2.strategy == "fsdp (cp 2)" and both.strategy == "fsdp (tp 2, cp 2)"
    with pytest.raises(HpcError, match="zero3 with tp 1 x cp 2 x replicate 1: a mesh composes with FSDP2 only"):
        est.estimate(10**9, "zero3", world_size=8, cp=2)
    with pytest.raises(HpcError, match="tp 2 x cp 4 x replicate 1 does not divide 12 GPU"):
        est.estimate(10**9, "fsdp", world_size=12, tp=2, cp=4)


def test_estimate_memory_cp_flag():
    from click.testing import CliRunner

    from hpc.cli.estimate_cmd import estimate_memory

    def run(*args):
        return CliRunner().invoke(estimate_memory, ["8B", "--world-size", "16", "--batch-size", "1", "--seq-len",
                                                    "8192", "--hidden-size", "4096", "--layers", "32", "--json",
                                                    *args])

    plain, cp = run("--strategy", "fsdp"), run("--cp-size", "2")
    assert plain.exit_code == 0 and cp.exit_code == 0, (plain.output, cp.output)
    plain_fsdp = json.loads(plain.output)["strategies"][0]
    rows = {row["strategy"]: row for row in json.loads(cp.output)["strategies"]}
    assert list(rows) == ["fsdp_grad_op (cp 2)", "fsdp (cp 2)", "fsdp_offload (cp 2)"]
    assert rows["fsdp (cp 2)"]["activations"] * 2 == plain_fsdp["activations"]
    assert rows["fsdp (cp 2)"]["state_bytes"] == plain_fsdp["state_bytes"]
    bad = subprocess.run([sys.executable, "-m", "hpc", "estimate-memory", "8B", "--world-size", "6", "--cp", "4"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "tp 1 x cp 4 x replicate 1 does not divide 6 GPU(s)" in bad.stderr


def test_an_accelerate_megatron_config_file_as_accelerate_config_writes_it_is_taken(tmp_path):
    """The seed's file as the seed's Megatron-LM examples ship it: distributed_type MEGATRON_LM, megatron_lm_config's
    keys with their prefix, nulls for what `accelerate config` was not told (gpu_ids, the main process' address and
    port: Accelerate reads them as unset), empty deepspeed/fsdp sections."""
    (tmp_path / "acc.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndeepspeed_config: {}\ndistributed_type: MEGATRON_LM\n"
        "downcast_bf16: 'no'\nfsdp_config: {}\ngpu_ids: null\nmain_process_ip: null\n"
        "main_process_port: null\nmain_training_function: main\nrdzv_backend: static\nsame_network: true\n"
        "machine_rank: 0\nnum_machines: 2\nnum_processes: 4\nmegatron_lm_config:\n"
        "  megatron_lm_gradient_clipping: 1.0\n  megatron_lm_num_micro_batches: 2\n  megatron_lm_pp_degree: 2\n"
        "  megatron_lm_recompute_activations: true\n  megatron_lm_sequence_parallelism: true\n"
        "  megatron_lm_tp_degree: 2\n  megatron_lm_use_distributed_optimizer: false\n")
    done = render(tmp_path, "--config_file", str(tmp_path / "acc.yaml"))
    assert done.returncode == 0, done.stderr
    for line in ("ACCELERATE_USE_MEGATRON_LM=true", "MEGATRON_LM_TP_DEGREE=2", "MEGATRON_LM_PP_DEGREE=2",
                 "MEGATRON_LM_NUM_MICRO_BATCHES=2", "MEGATRON_LM_SEQUENCE_PARALLELISM=true",
                 "MEGATRON_LM_RECOMPUTE_ACTIVATIONS=true", "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER=false",
                 "MEGATRON_LM_GRADIENT_CLIPPING=1.0"):
        assert f"export {line}" in done.stdout, line
