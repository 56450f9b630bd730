"""Strategy settings: Accelerate's spellings, the DeepSpeed config with its "auto"s, and the hand-off from
profile / job file / flags to the job's runtime config. No processes are started here."""

import json

import pytest

from hpc.cluster.config.precedence import flag_layer, job_file_layer, resolve, set_layer
from hpc.contract import runtime_config
from hpc.errors import HpcError
from hpc.runtime.strategies import deepspeed_config
from hpc.runtime.strategies.plugins import DeepSpeedPlugin, FullyShardedDataParallelPlugin


def build(plugin, **kw):
    args = {"micro_batch_size": 4, "gradient_accumulation_steps": 2, "world_size": 8, "mixed_precision": "bf16",
            "num_params": 10**9, **kw}
    return deepspeed_config.build(plugin, **args)


def test_autos_are_filled_from_the_training_loop():
    cfg = build(DeepSpeedPlugin(zero_stage=3, offload_optimizer=True, gradient_clipping=1.0))
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"], cfg["train_batch_size"]) == \
        (4, 2, 64)
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"] and cfg["gradient_clipping"] == 1.0
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 10**9 // 16


def test_a_user_json_keeps_its_values_and_gets_its_autos(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                                "zero_optimization": {"stage": 1, "overlap_comm": True}, "bf16": {"enabled": "auto"}}))
    cfg = build(DeepSpeedPlugin(zero_stage=3, hf_ds_config=str(path)))
    assert cfg["zero_optimization"]["stage"] == 1 and cfg["zero_optimization"]["overlap_comm"]
    assert cfg["train_micro_batch_size_per_gpu"] == 4 and cfg["bf16"]["enabled"] is True


@pytest.mark.parametrize("user,problem", [({"gradient_accumulation_steps": 8}, "gradient_accumulation_steps=8"),
                                          ({"fp16": {"enabled": True}}, "fp16.enabled=True"),
                                          ({"train_batch_size": 10}, "train_batch_size=10")])
def test_a_user_json_that_contradicts_the_loop_is_an_error(user, problem):
    with pytest.raises(HpcError, match=problem.replace(".", r"\.")):
        build(DeepSpeedPlugin(hf_ds_config=user))


def test_a_broken_or_missing_json_is_named(tmp_path):
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(HpcError, match="not valid JSON"):
        build(DeepSpeedPlugin(hf_ds_config=str(tmp_path / "bad.json")))
    with pytest.raises(HpcError, match="does not exist"):
        build(DeepSpeedPlugin(hf_ds_config=str(tmp_path / "none.json")))


def test_accelerate_spellings():
    fsdp = FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD", auto_wrap_policy="TRANSFORMER_AUTO_WRAP",
                                          transformer_cls_names_to_wrap="Block, Attention", cpu_offload=False)
    assert fsdp.transformer_cls_names_to_wrap == ["Block", "Attention"]
    assert FullyShardedDataParallelPlugin(sharding_strategy=2).sharding_strategy == "SHARD_GRAD_OP"
    assert FullyShardedDataParallelPlugin(min_num_params=1000).auto_wrap_policy == "SIZE_BASED_WRAP"
    ds = DeepSpeedPlugin.coerce({"zero_stage": 2, "offload_optimizer": False, "gradient_accumulation_steps": 4})
    assert (ds.zero_stage, ds.offload_optimizer, ds.gradient_accumulation_steps) == (2, False, 4)
    assert DeepSpeedPlugin(zero_stage=3, offload_param_device="cpu").offload_param is True


# FullyShardedDataParallelPlugin's fields in Accelerate 1.15, in its order
ACCELERATE_FSDP_KEYWORDS = [
    "fsdp_version", "sharding_strategy", "reshard_after_forward", "backward_prefetch", "mixed_precision_policy",
    "auto_wrap_policy", "cpu_offload", "ignored_modules", "state_dict_type", "state_dict_config",
    "optim_state_dict_config", "limit_all_gathers", "use_orig_params", "param_init_fn", "sync_module_states",
    "forward_prefetch", "activation_checkpointing", "activation_checkpointing_offload", "cpu_ram_efficient_loading",
    "transformer_cls_names_to_wrap", "min_num_params"]


def test_the_fsdp_plugin_takes_every_keyword_of_accelerate():
    import dataclasses

    from torch.distributed.fsdp import FullStateDictConfig

    ours = {f.name for f in dataclasses.fields(FullyShardedDataParallelPlugin)}
    assert set(ACCELERATE_FSDP_KEYWORDS) <= ours
    full = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    plugin = FullyShardedDataParallelPlugin(state_dict_config=full, optim_state_dict_config=full, fsdp_version=1,
                                            use_orig_params=True, limit_all_gathers=True, param_init_fn=print)
    assert plugin.state_dict_config is full and plugin.sharding_strategy == "FULL_SHARD"


@pytest.mark.parametrize("make,message", [
    (lambda: FullyShardedDataParallelPlugin(activation_checkpointing_offload=True), "activation_checkpointing"),
    (lambda: FullyShardedDataParallelPlugin(fsdp_version=3), "fsdp_version"),
    (lambda: FullyShardedDataParallelPlugin(param_init_fn="zeros"), "param_init_fn"),
    (lambda: FullyShardedDataParallelPlugin(sharding_strategy="FULL"), "sharding_strategy"),
    (lambda: FullyShardedDataParallelPlugin(auto_wrap_policy="SIZE_BASED_WRAP"), "min_num_params"),
    (lambda: DeepSpeedPlugin(zero_stage=4), "zero_stage"),
    (lambda: DeepSpeedPlugin(zero_stage=2, offload_param=True), "stage 3"),
    (lambda: DeepSpeedPlugin.coerce({"zero_stag": 2}), "zero_stag"),
    (lambda: DeepSpeedPlugin(offload_optimizer_device="nvme"), "nvme"),
])
def test_bad_plugin_settings_are_one_clear_error(make, message):
    with pytest.raises(HpcError, match=message):
        make()


def test_settings_travel_from_job_file_and_flags_into_the_runtime_config(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("strategy: fsdp\nfsdp_sharding_strategy: HYBRID_SHARD\n"
                   "fsdp_transformer_layer_cls_to_wrap: [Block]\nfsdp_activation_checkpointing: true\n")
    eff = resolve("local", [job_file_layer(job), set_layer(["fsdp_min_num_params=100"]),
                            flag_layer({"script": "train.py", "fsdp_sharding_strategy": "SHARD_GRAD_OP"})])
    runtime_config.from_effective(eff, warns_before_limit=False).write(tmp_path / "runtime.json")
    cfg = runtime_config.read(tmp_path / "runtime.json").as_dict()  # what the job's processes see
    assert cfg["strategy"] == "fsdp" and cfg["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    assert cfg["fsdp_transformer_layer_cls_to_wrap"] == ["Block"] and cfg["fsdp_activation_checkpointing"] is True
    plugin = FullyShardedDataParallelPlugin.from_config(cfg)
    assert (plugin.sharding_strategy, plugin.auto_wrap_policy, plugin.activation_checkpointing) == \
        ("SHARD_GRAD_OP", "TRANSFORMER_AUTO_WRAP", True)
    assert "zero_stage" not in cfg  # unset keys stay out: Accelerator's defaults decide


def test_offload_param_without_stage_3_is_refused_at_submit():
    with pytest.raises(HpcError, match="offload-param.*stage 3"):
        resolve("local", [flag_layer({"script": "t.py", "strategy": "deepspeed", "zero_stage": 2,
                                      "offload_param": True})])


def test_a_runtime_config_from_the_previous_version_is_read_and_a_bad_one_named(tmp_path):
    """A job submitted before an upgrade and requeued after it carries on; a damaged file is one line."""
    old = tmp_path / "old.json"
    old.write_text('{"version": 1, "scheduler": "slurm", "launcher": "srun", "strategy": "fsdp", '
                   '"preemption": {"signal": "USR1", "lead_time": 60, "requeue": true, "max_requeues": 3}}')
    cfg = runtime_config.read(old).as_dict()
    assert cfg["warns_before_limit"] is True and cfg["strategy"] == "fsdp" and cfg["preemption"]["lead_time"] == 60
    for text, words in (('{"version": 9}', "has version 9"), ("{not json", "cannot read"),
                        ('{"version": 2, "nodez": 2}', "nodez")):
        old.write_text(text)
        with pytest.raises(HpcError, match=words):
            runtime_config.read(old)
