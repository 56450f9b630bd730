"""An `accelerate launch` / `accelerate config` user's flags, files and variables, as hpc takes them (rendered,
read, in this process; the same in real training processes: tests/test_accelerate_compat.py)."""

import json
import logging
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from hpc.contract import accelerate_settings
from tests.conftest import hpc_cmd

# The config templates of Accelerate's repository (examples/config_yaml_templates, examples/slurm), as a user
# brings them; the keys and values are theirs, the comments dropped.
TEMPLATES = {
    "fsdp.yaml": """
        distributed_type: FSDP
        mixed_precision: 'bf16'
        num_processes: 2
        fsdp_config:
          fsdp_activation_checkpointing: false
          fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
          fsdp_backward_prefetch: BACKWARD_PRE
          fsdp_cpu_ram_efficient_loading: true
          fsdp_forward_prefetch: false
          fsdp_offload_params: false
          fsdp_sharding_strategy: FULL_SHARD
          fsdp_state_dict_type: SHARDED_STATE_DICT
          fsdp_sync_module_states: true
          fsdp_use_orig_params: true
    """,
    "deepspeed.yaml": """
        distributed_type: DEEPSPEED
        deepspeed_config:
          deepspeed_config_file: ../deepspeed_config_templates/zero_stage1_config.json
          zero3_init_flag: false
        num_processes: 2
    """,
    "multi_gpu.yaml": """
        distributed_type: "MULTI_GPU"
        mixed_precision: "bf16"
        num_processes: 2
    """,
    "multi_node.yaml": """
        distributed_type: MULTI_GPU
        machine_rank: 0
        main_process_ip: '1234'
        main_process_port: 9999
        num_machines: 2
        num_processes: 8
        rdzv_backend: static
        same_network: false
    """,
    "single_accelerator.yaml": """
        distributed_type: "NO"
        mixed_precision: "bf16"
    """,
    "fp8.yaml": """
        distributed_type: "NO"
        mixed_precision: "fp8"
        fp8_config:
          backend: TE
          amax_history_len: 1024
          fp8_format: E4M3
          interval: 1
          margin: 0
          override_linear_precision: [false, false, false]
          use_autocast_during_eval: false
    """,
    "multi_xpu.yaml": """
        distributed_type: "MULTI_XPU"
        mixed_precision: "bf16"
        num_processes: 2
    """,
    "slurm_fsdp_config.yaml": """
        distributed_type: FSDP
        fsdp_config:
          fsdp_activation_checkpointing: false
          fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
          fsdp_backward_prefetch: BACKWARD_PRE
          fsdp_cpu_ram_efficient_loading: true
          fsdp_forward_prefetch: false
          fsdp_offload_params: false
          fsdp_sharding_strategy: FULL_SHARD
          fsdp_state_dict_type: SHARDED_STATE_DICT
          fsdp_sync_module_states: true
          fsdp_use_orig_params: true
    """,
}


def write_templates(folder: Path) -> Path:
    folder = folder / "configs"
    folder.mkdir()
    for name, text in TEMPLATES.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    ds = folder.parent / "deepspeed_config_templates"
    ds.mkdir()
    (ds / "zero_stage1_config.json").write_text(json.dumps({"zero_optimization": {"stage": 1},
                                                            "train_micro_batch_size_per_gpu": "auto"}))
    return folder


def hpc(tmp, *args, env=None, input=None, timeout=120):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_", "ACCELERATE_", "FSDP_", "SLURM_",
                                                                     "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    full.update({"XDG_CONFIG_HOME": str(tmp / "xdg"), "HF_HOME": str(tmp / "hf"), **(env or {})})
    return subprocess.run(hpc_cmd(*args), cwd=tmp, env=full, capture_output=True, text=True, input=input,
                          timeout=timeout)


def render_json(tmp, *args, env=None) -> dict:
    proc = hpc(tmp, "render", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    out["stderr"] = proc.stderr
    return out


def _typed(text: str):
    if text == "-":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def effective(rendered: dict) -> dict:
    """The effective job as --explain shows it (lists joined by spaces), typed back."""
    return {k: _typed(v["value"]) for k, v in rendered["effective"].items()}


# --- the config templates -------------------------------------------------------------------------------


def test_accelerate_fsdp_template_renders_as_fsdp_with_its_settings(tmp_path):
    configs = write_templates(tmp_path)
    out = render_json(tmp_path, "-p", "slurm-local", "--config_file", str(configs / "fsdp.yaml"), "train.py")
    job = effective(out)
    assert (job["strategy"], job["mixed_precision"], job["num_processes"], job["nproc_per_node"]) == (
        "fsdp", "bf16", 2, 2)
    assert (job["fsdp_auto_wrap_policy"], job["fsdp_state_dict_type"], job["fsdp_sync_module_states"],
            job["fsdp_cpu_ram_efficient_loading"], job["fsdp_cpu_offload"]) == (
        "TRANSFORMER_AUTO_WRAP", "SHARDED_STATE_DICT", True, True, False)
    assert out["effective"]["fsdp_auto_wrap_policy"]["source"] == (
        f"accelerate config {configs / 'fsdp.yaml'} (fsdp_config.fsdp_auto_wrap_policy)")
    assert out["effective"]["nproc_per_node"]["source"] == "derived (num_processes / nodes)"
    # what `accelerate launch` would export, for code that reads it (transformers' rank-0-only loading)
    for line in ("export ACCELERATE_USE_FSDP=true", "export FSDP_CPU_RAM_EFFICIENT_LOADING=true",
                 "export FSDP_AUTO_WRAP_POLICY=TRANSFORMER_BASED_WRAP", "export ACCELERATE_MIXED_PRECISION=bf16"):
        assert line in out["script"].splitlines()
    assert out["stderr"] == ""  # Accelerate's defaults ask for nothing, so nothing is said


def test_every_accelerate_template_renders_or_says_why_not(tmp_path):
    configs = write_templates(tmp_path)
    ds = render_json(tmp_path, "-p", "slurm-local", "--config_file", str(configs / "deepspeed.yaml"), "t.py")
    assert effective(ds)["strategy"] == "deepspeed"
    # relative to the config file, as Accelerate reads it
    assert ds["runtime_config"]["deepspeed_config"] == str(tmp_path / "deepspeed_config_templates"
                                                          / "zero_stage1_config.json")
    gpu = effective(render_json(tmp_path, "-p", "slurm-local", "--config_file", str(configs / "multi_gpu.yaml"),
                                "t.py"))
    assert (gpu["strategy"], gpu["mixed_precision"], gpu["nproc_per_node"]) == ("ddp", "bf16", 2)
    node = render_json(tmp_path, "-p", "slurm-local", "--config_file", str(configs / "multi_node.yaml"), "t.py")
    job = effective(node)
    assert (job["nodes"], job["nproc_per_node"], job["main_process_port"]) == (2, 4, 9999)
    assert "export MASTER_PORT=9999" in node["script"].splitlines()
    assert "main_process_ip=1234: the job's first node is the main process" in node["stderr"]
    single = effective(render_json(tmp_path, "--config_file", str(configs / "single_accelerator.yaml"), "t.py"))
    assert (single["strategy"], single["mixed_precision"]) == (None, "bf16")
    te = hpc(tmp_path, "render", "--config_file", str(configs / "fp8.yaml"), "t.py")  # its backend: TE
    assert te.returncode == 2 and len(te.stderr.strip().splitlines()) == 1
    assert "fp8_config.backend = 'TE': hpc's fp8 is torchao's (AO)" in te.stderr, te.stderr
    ao = configs / "fp8_ao.yaml"
    ao.write_text((configs / "fp8.yaml").read_text().replace("backend: TE", "backend: AO"))
    fp8 = render_json(tmp_path, "--config_file", str(ao), "t.py")
    assert effective(fp8)["mixed_precision"] == "fp8" and "fp8_config.fp8_format=E4M3: not read by hpc" in fp8["stderr"]
    slurm_fsdp = effective(render_json(tmp_path, "-p", "slurm-local", "--config_file",
                                       str(configs / "slurm_fsdp_config.yaml"), "t.py"))
    assert slurm_fsdp["strategy"] == "fsdp"
    xpu = hpc(tmp_path, "render", "--config_file", str(configs / "multi_xpu.yaml"), "t.py")
    assert xpu.returncode == 2 and len(xpu.stderr.strip().splitlines()) == 1
    assert "multi_xpu.yaml: distributed_type = 'MULTI_XPU'" in xpu.stderr


@pytest.mark.parametrize("text, expected", [
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_stratgy: FULL_SHARD\n",
     "fsdp_config.fsdp_sharding_stratgy = 'FULL_SHARD': unknown key; fix: did you mean 'fsdp_sharding_strategy'?"),
    ("distributed_type: TPU\n", "distributed_type = 'TPU': is a device or engine hpc does not run"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_state_dict_type: LOCAL_STATE_DICT\n",
     "fsdp_config.fsdp_state_dict_type = 'LOCAL_STATE_DICT'"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  offload_optimizer_device: nvme\n",
     "deepspeed_config.offload_optimizer_device = 'nvme': NVMe offload is not wired up"),
    ("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: NO\n", "compute_environment = 'AMAZON_SAGEMAKER'"),
    ("distributed_type: FSDP\nnum_processes: [2\n", "not valid YAML"),
    ("- a\n- b\n", "must hold a mapping"),
])
def test_a_config_key_hpc_cannot_honour_is_one_line_naming_file_and_key(tmp_path, text, expected):
    (tmp_path / "acc.yaml").write_text(text)
    proc = hpc(tmp_path, "render", "--config_file", "acc.yaml", "t.py")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert expected in proc.stderr and "acc.yaml" in proc.stderr


def test_json_config_and_the_default_file_where_accelerate_finds_it(tmp_path):
    default = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text("distributed_type: MULTI_CPU\nmixed_precision: fp16\nnum_processes: 2\n")
    (tmp_path / "acc.json").write_text(json.dumps({"distributed_type": "MULTI_GPU", "mixed_precision": "bf16"}))
    out = render_json(tmp_path, "-p", "slurm-local", "train.py")
    job = effective(out)
    # the default file describes the machine `accelerate config` ran on: its shape is not applied to the job
    assert (job["use_cpu"], job["mixed_precision"], job["num_processes"], job["strategy"]) == (
        None, "fp16", None, "ddp")
    assert out["effective"]["mixed_precision"]["source"] == f"accelerate default config {default} (mixed_precision)"
    assert "num_processes, distributed_type MULTI_CPU: not applied from Accelerate's default file" in out["stderr"]
    # --config_file beats the default file, key by key, and a named file's shape is applied
    (tmp_path / "cpu.yaml").write_text("distributed_type: MULTI_CPU\nnum_processes: 2\n")
    job = effective(render_json(tmp_path, "--config_file", "acc.json", "train.py"))
    assert (job["use_cpu"], job["mixed_precision"], job["strategy"]) == (None, "bf16", "ddp")
    job = effective(render_json(tmp_path, "--config_file", "cpu.yaml", "train.py"))
    assert (job["use_cpu"], job["nproc_per_node"]) == (True, 2)
    # XDG_CACHE_HOME moves it when HF_HOME is unset, as in Accelerate
    env = {"HF_HOME": "", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert render_json(tmp_path, "train.py", env=env)["runtime_config"].get("mixed_precision") is None


def test_precedence_from_accelerate_defaults_up_to_flags(tmp_path):
    default = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text("distributed_type: MULTI_GPU\nmixed_precision: fp16\ngradient_accumulation_steps: 2\n"
                       "deepspeed_config: {}\n")
    own = tmp_path / "xdg" / "hpc" / "job.yaml"
    own.parent.mkdir(parents=True)
    own.write_text("mixed_precision: bf16\ngradient_accumulation_steps: 3\ncpus_per_task: 1\n")
    (tmp_path / "acc.yaml").write_text("distributed_type: MULTI_GPU\ngradient_accumulation_steps: 4\n")
    (tmp_path / "job.yaml").write_text("gradient_accumulation_steps: 5\n")
    layers = [(), ("--config_file", "acc.yaml"), ("--config", "job.yaml"), ("--gradient_accumulation_steps", "6")]
    seen = []
    for i in range(len(layers)):
        args = [a for layer in layers[:i + 1] for a in layer]
        seen.append(effective(render_json(tmp_path, *args, "train.py"))["gradient_accumulation_steps"])
    assert seen == [3, 4, 5, 6]
    out = render_json(tmp_path, "train.py")
    assert out["effective"]["mixed_precision"]["source"] == f"default job file {own}"
    assert out["effective"]["strategy"]["source"] == f"accelerate default config {default} (distributed_type)"


# --- the launch flags ---------------------------------------------------------------------------------


def test_launch_flags_with_underscores_or_dashes_on_submit(tmp_path):
    job = effective(render_json(tmp_path, "-p", "slurm-local", "-N", "2", "--num_processes", "4", "--use_fsdp",
                                "--fsdp_offload_params", "true", "--fsdp-sharding-strategy", "HYBRID_SHARD_ZERO2",
                                "--mixed_precision", "bf16", "--gradient_accumulation_steps", "2",
                                "--num-cpu-threads-per-process", "3", "--main_process_port", "29511",
                                "--dynamo_backend", "eager", "--monitor_interval", "0.5", "t.py"))
    assert (job["nproc_per_node"], job["strategy"], job["fsdp_cpu_offload"], job["fsdp_sharding_strategy"],
            job["mixed_precision"], job["gradient_accumulation_steps"], job["cpu_threads_per_process"],
            job["main_process_port"], job["dynamo_backend"], job["monitor_interval"]) == (
        2, "fsdp", True, "HYBRID_SHARD_ZERO2", "bf16", 2, 3, 29511, "eager", 0.5)
    ds = effective(render_json(tmp_path, "-p", "slurm-local", "--use_deepspeed", "--zero_stage", "3",
                               "--offload_param_device", "cpu", "--offload_optimizer_device", "none", "t.py"))
    assert (ds["strategy"], ds["zero_stage"], ds["offload_param"], ds["offload_optimizer"]) == (
        "deepspeed", 3, True, False)
    cpu = effective(render_json(tmp_path, "--cpu", "--multi_gpu", "--debug", "-m", "pkg.train", "x"))
    assert (cpu["use_cpu"], cpu["strategy"], cpu["debug"], cpu["module"], cpu["args"]) == (
        True, "ddp", True, "pkg.train", "x")


def test_launch_flags_that_slurm_decides_are_explained_or_refused(tmp_path):
    out = render_json(tmp_path, "-p", "slurm-local", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
                      "--same_network", "--rdzv_backend", "c10d", "t.py")
    assert (out["stderr"].count("hpc: note:") == 2
            and "--machine_rank=1: SLURM numbers the nodes; hpc submit leaves it to SLURM" in out["stderr"])
    odd = hpc(tmp_path, "render", "-p", "slurm-local", "-N", "2", "--num_processes", "3", "t.py")
    assert odd.returncode == 2 and "--num_processes = 3: is not 2 nodes x" in odd.stderr
    for args, expected in [(["--tpu"], "--tpu = True: is for TPUs"),
                           (["-p", "slurm-local", "--gpu_ids", "0,1"], "SLURM gives each job its own GPUs"),
                           (["--cpu-bind", "cores"], "CPU binding is srun's"),
                           (["--fsdp_state_dict_type", "LOCAL_STATE_DICT"], "LOCAL_STATE_DICT is FSDP1's own"),
                           (["--num_machines", "0"], "--num_machines = 0: must be 1 or more")]:
        proc = hpc(tmp_path, "render", *args, "t.py")
        assert proc.returncode == 2 and expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (
            args, proc.stderr)


def test_cpu_bind_threads_and_gpu_ids_reach_the_script(tmp_path):
    slurm = render_json(tmp_path, "-p", "slurm-local", "--cpu-bind", "cores", "-c", "2", "t.py")["script"]
    assert "--cpu-bind=cores" in next(line for line in slurm.splitlines() if line.startswith("srun "))
    assert "export OMP_NUM_THREADS=2" in slurm.splitlines()  # cpus_per_task
    shared = render_json(tmp_path, "--nproc", "2", "t.py")["script"]  # no say: the node's CPUs shared
    assert 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cpus > 2 ? cpus / 2 : 1 ))}"' in shared.splitlines()
    local = render_json(tmp_path, "--gpu_ids", "0,1", "--num_cpu_threads_per_process", "5", "t.py")["script"]
    assert {"export CUDA_VISIBLE_DEVICES=0,1", "export OMP_NUM_THREADS=5"} <= set(local.splitlines())


def test_accelerate_variables_round_trip():
    values = {"strategy": "fsdp", "fsdp_auto_wrap_policy": "TRANSFORMER_AUTO_WRAP",
              "fsdp_sharding_strategy": "SHARD_GRAD_OP",
              "fsdp_transformer_layer_cls_to_wrap": ["Block", "Head"], "fsdp_cpu_offload": True,
              "mixed_precision": "bf16", "gradient_accumulation_steps": 4, "dynamo_backend": "eager",
              "use_cpu": True, "debug": True, "zero_stage": 2}
    env = accelerate_settings.to_environ(values)
    assert env["ACCELERATE_USE_FSDP"] == "true" and "ACCELERATE_DEEPSPEED_ZERO_STAGE" not in env  # not this strategy
    back = accelerate_settings.from_environ(env).values
    assert back == {k: v for k, v in values.items() if k != "zero_stage"}


# --- hpc config ---------------------------------------------------------------------------------------


def test_config_import_writes_a_job_file_hpc_reads_back(tmp_path):
    configs = write_templates(tmp_path)
    proc = hpc(tmp_path, "config", "import", str(configs / "fsdp.yaml"), "-o", "fsdp-job.yaml")
    assert proc.returncode == 0, proc.stderr
    via_file = effective(render_json(tmp_path, "--config", "fsdp-job.yaml", "t.py"))
    direct = effective(render_json(tmp_path, "--config_file", str(configs / "fsdp.yaml"), "t.py"))
    assert via_file == direct
    again = hpc(tmp_path, "config", "import", str(configs / "fsdp.yaml"), "-o", "fsdp-job.yaml")
    assert again.returncode == 2 and "never overwrites" in again.stderr


def test_config_asks_accelerates_questions_and_writes_the_default_job_file(tmp_path):
    # nodes, processes, strategy, then FSDP's: sharding, wrap, block class, offload, activation ckpt, format,
    # rank-0 loading; then precision, accumulation, compile backend, resume
    answers = "2\n2\nfsdp\nSHARD_GRAD_OP\n\nBlock\nn\ny\n\nn\nbf16\n4\nno\ny\n"
    proc = hpc(tmp_path, "config", input=answers)
    assert proc.returncode == 0, proc.stderr
    own = tmp_path / "xdg" / "hpc" / "job.yaml"
    job = effective(render_json(tmp_path, "-p", "slurm-local", "t.py"))
    assert (job["nodes"], job["nproc_per_node"], job["strategy"], job["fsdp_sharding_strategy"],
            job["fsdp_transformer_layer_cls_to_wrap"], job["fsdp_activation_checkpointing"],
            job["fsdp_cpu_ram_efficient_loading"], job["mixed_precision"], job["gradient_accumulation_steps"],
            job["auto_resume"]) == (2, 2, "fsdp", "SHARD_GRAD_OP", "Block", True, False, "bf16", 4, True)
    assert "zero_stage" not in own.read_text()  # DeepSpeed's questions were not asked
    assert hpc(tmp_path, "config", "default").returncode == 2  # the file exists: never overwritten
    flags_only = hpc(tmp_path, "config", "--strategy", "deepspeed", "--zero-stage", "3", "-y", "-o", "ds.yaml")
    assert flags_only.returncode == 0, flags_only.stderr
    ds = effective(render_json(tmp_path, "-p", "slurm-local", "--config", "ds.yaml", "t.py"))
    assert (ds["strategy"], ds["zero_stage"], ds["offload_param"]) == ("deepspeed", 3, False)
    no_input = hpc(tmp_path, "config", "-o", "x.yaml", input="")
    assert no_input.returncode == 2 and "no answer for 'nodes'" in no_input.stderr


# --- in this process -------------------------------------------------------------------------------

def test_get_logger_speaks_on_the_main_process_at_accelerates_log_level(monkeypatch, caplog):
    from hpc.logging import get_logger

    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "debug")
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)
    logger = get_logger("hpc.test.logging")
    with caplog.at_level("DEBUG", logger="hpc.test.logging"):
        logger.debug("only rank 0 says this")
        logger.info("every rank says this", main_process_only=False)
        logger.warning_once("once")
        logger.warning_once("once")
    assert logger.logger.level == logging.DEBUG  # from ACCELERATE_LOG_LEVEL
    assert [r.getMessage() for r in caplog.records] == ["[RANK 1] every rank says this"]
    assert caplog.records[0].filename == "test_accelerate_compat.py"  # the caller's line, not the adapter's
    monkeypatch.setenv("RANK", "0")
    caplog.clear()
    with caplog.at_level("DEBUG", logger="hpc.test.logging"):
        logger.debug("rank 0 speaks")
        logger.warning_once("twice?")
        logger.warning_once("twice?")
    assert [r.getMessage() for r in caplog.records] == ["[RANK 0] rank 0 speaks", "[RANK 0] twice?"]


def test_review_fixes_env_adds_up_omp_from_env_wins_fsdp1_strategy_kept(tmp_path):
    (tmp_path / "job.yaml").write_text("env: {WANDB_PROJECT: x}\n")
    out = render_json(tmp_path, "-p", "slurm-local", "-c", "2", "--config", "job.yaml", "--env", "NCCL_DEBUG=INFO",
                      "--env", "OMP_NUM_THREADS=4", "t.py")
    lines = out["script"].splitlines()
    assert {"export WANDB_PROJECT=x", "export NCCL_DEBUG=INFO", "export OMP_NUM_THREADS=4"} <= set(lines)
    assert sum(line.startswith("export OMP_NUM_THREADS") for line in lines) == 1  # the job's own, not cpus_per_task
    (tmp_path / "fsdp1.yaml").write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_reshard_after_forward: "
                                         "HYBRID_SHARD\n")
    job = effective(render_json(tmp_path, "--config_file", "fsdp1.yaml", "t.py"))
    assert (job["fsdp_sharding_strategy"], job["fsdp_reshard_after_forward"]) == ("HYBRID_SHARD", True)


def test_torch_dynamo_plugin_reads_accelerates_variables_and_gives_what_differs_from_the_defaults(monkeypatch):
    """Accelerate's own test_kwargs_handlers.py::test_torch_dynamo_plugin, on hpc: a field left None comes from
    ACCELERATE_DYNAMO_*, and to_kwargs gives the fields that differ from a plugin built with no environment."""
    from hpc.utils import DynamoBackend, TorchDynamoPlugin

    for key in [k for k in os.environ if k.startswith("ACCELERATE_DYNAMO_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "aot_ts_nvfuser")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    plugin = TorchDynamoPlugin()
    assert plugin.backend == DynamoBackend.AOT_TS_NVFUSER and plugin.fullgraph is True and plugin.dynamic is None
    assert plugin.to_kwargs() == {"backend": "aot_ts_nvfuser", "mode": "reduce-overhead", "fullgraph": True}
    assert os.environ["ACCELERATE_DYNAMO_BACKEND"] == "aot_ts_nvfuser"  # to_kwargs put the environment back
    assert TorchDynamoPlugin(backend="inductor", mode="max-autotune").as_settings()["dynamo_backend"] == "inductor"
    monkeypatch.delenv("ACCELERATE_DYNAMO_BACKEND")
    assert TorchDynamoPlugin().as_settings()["dynamo_backend"] == "no"  # off, as Accelerate's default
