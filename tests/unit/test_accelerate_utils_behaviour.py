"""The names hpc.utils, hpc.commands and hpc.test_utils add for Accelerate's scripts do what Accelerate's do, on one
process: no name is a silent stub (tests/unit/test_accelerate_surface.py holds that each exists)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import unittest

import pytest
import torch
import torch.distributed.checkpoint as dcp

import hpc.utils as hu
from hpc.errors import HpcError
from hpc.runtime.process import state as shared_state


@pytest.fixture
def single(monkeypatch):
    """A fresh PartialState in this process, world of one; the variables it exports are taken back afterwards."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "ACCELERATE_", "TORCHELASTIC")):
            monkeypatch.delenv(key)
    monkeypatch.setattr(shared_state, "_accelerator", shared_state._no_accelerator)
    shared_state.PartialState._reset_state()
    yield shared_state.PartialState()
    shared_state.PartialState._reset_state()
    os.environ.clear()
    os.environ.update(saved)


def test_environment_helpers_restore_what_was_there(monkeypatch):
    monkeypatch.setenv("HPC_T_KEEP", "old")
    monkeypatch.delenv("HPC_T_NEW", raising=False)
    with hu.patch_environment(hpc_t_keep=1, hpc_t_new=os.path.sep):
        assert os.environ["HPC_T_KEEP"] == "1" and os.environ["HPC_T_NEW"] == os.path.sep
    assert os.environ["HPC_T_KEEP"] == "old" and "HPC_T_NEW" not in os.environ
    with pytest.raises(RuntimeError), hu.clear_environment():
        assert os.environ == {}
        raise RuntimeError("restored even so")
    assert os.environ["HPC_T_KEEP"] == "old"
    assert hu.str_to_bool("Yes") == 1 and hu.str_to_bool("off", to_bool=True) is False
    with pytest.raises(ValueError, match="invalid truth value"):
        hu.str_to_bool("maybe")
    monkeypatch.setenv("HPC_T_FLAG", "true")
    monkeypatch.setenv("HPC_T_INT", "3")
    assert hu.parse_flag_from_env("HPC_T_FLAG") and not hu.parse_flag_from_env("HPC_T_MISSING")
    assert hu.get_int_from_env(["HPC_T_MISSING", "HPC_T_INT"], 7) == 3 and hu.get_int_from_env(["HPC_T_X"], 7) == 7

    @hu.purge_accelerate_environment
    def launcher_sets_a_variable():
        os.environ["ACCELERATE_HPC_T"] = "1"

    launcher_sets_a_variable()
    assert "ACCELERATE_HPC_T" not in os.environ


def test_versions_and_probes_answer_truthfully():
    import importlib.util

    assert hu.compare_versions("torch", ">=", "2.0") and not hu.is_torch_version("<", "2.0")
    with pytest.raises(ValueError, match="operation"):
        hu.compare_versions("torch", "~=", "2.0")
    # platforms hpc does not run: False; packages: whether installed
    assert not any(probe() for probe in (hu.is_torch_xla_available, hu.is_npu_available, hu.is_musa_available,
                                         hu.is_sdaa_available, hu.is_neuron_available, hu.is_habana_gaudi1))
    for probe, module in ((hu.is_bnb_available, "bitsandbytes"), (hu.is_peft_available, "peft"),
                          (hu.is_torchao_available, "torchao"), (hu.is_pandas_available, "pandas")):
        assert probe() is (importlib.util.find_spec(module) is not None), module
    assert "fp16" in hu.PrecisionType and "fp7" not in hu.PrecisionType and str(hu.LoggerType.WANDB) == "wandb"
    assert hu.DynamoBackend("INDUCTOR").value == "INDUCTOR" and "INDUCTOR" in hu.DynamoBackend.list()


def test_a_name_for_a_platform_hpc_does_not_run_refuses_in_one_line():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    for call in (lambda: hu.install_xla(), lambda: hu.convert_model(model), lambda: hu.apply_fp8_autowrap(model, None),
                 lambda: hu.load_and_quantize_model(model, None), lambda: hu.prepare_tpu(None, {})):
        with pytest.raises(HpcError) as refused:
            call()
        assert "\n" not in str(refused.value) and "hpc does not" in str(refused.value)
    assert not hu.has_transformer_engine_layers(model)


def test_extract_model_from_parallel_unwraps_and_walks_the_model_bottom_up():
    # torch.compile's wrappers are left to scripts/accelerate_conformance.py's runs: importing dynamo takes ~5 s
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.ReLU()))
    assert hu.extract_model_from_parallel(torch.nn.DataParallel(net)) is net
    assert not hu.is_compiled_module(net) and not hu.has_compiled_regions(net)
    order = [name for name, _ in hu.get_module_children_bottom_up(net, return_fqns=True)]
    assert order[-1] == "" and order.index("1.0") < order.index("1")


def test_extract_model_from_parallel_takes_off_mixed_precision(single):
    from hpc import Accelerator

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    assert model(torch.ones(1, 4)).dtype == torch.bfloat16
    plain = hu.extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert plain(torch.ones(1, 4)).dtype == torch.float32
    accelerator.end_training()


def test_save_writes_on_the_main_process_and_load_runs_no_code(single, tmp_path):
    state = {"w": torch.arange(3.0)}
    hu.save(state, tmp_path / "s.pt")
    assert torch.equal(hu.load(tmp_path / "s.pt")["w"], state["w"])
    tied = torch.ones(2)
    hu.save(__import__("collections").OrderedDict(a=tied, b=tied), tmp_path / "t.safetensors",
            safe_serialization=True)
    from safetensors.torch import load_file

    assert list(load_file(tmp_path / "t.safetensors")) == ["a"]  # the tied copy is written once

    class Planted:
        def __reduce__(self):
            return (os.system, ("echo planted",))

    (tmp_path / "evil.pt").write_bytes(pickle.dumps(Planted()))
    with pytest.raises(pickle.UnpicklingError):
        hu.load(tmp_path / "evil.pt")


def test_tensor_structures_round_trip_and_outputs_come_back_in_fp32():
    nest = {"x": torch.ones(2, 3, dtype=torch.float16), "y": [torch.zeros(4, dtype=torch.int64)]}
    info = hu.get_data_structure(nest)
    assert hu.is_tensor_information(info["x"]) and info["x"].shape == (2, 3)
    made = hu.initialize_tensors(info)
    assert made["x"].shape == (2, 3) and made["x"].dtype == torch.float16 and made["y"][0].dtype == torch.int64
    forward = hu.convert_outputs_to_fp32(lambda: nest)
    assert forward()["x"].dtype == torch.float32 and forward()["y"][0].dtype == torch.int64
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(forward.__wrapped__)
    assert hu.ignorant_find_batch_size("text") is None and hu.ignorant_find_batch_size(nest) == 2
    assert hu.pad_input_tensors(torch.ones(3, 4), 3, 4).shape == (4, 4)  # every rank of 4 gets a row
    with hu.GatheredParameters([torch.nn.Parameter(torch.ones(1))]):  # not ZeRO-3: the parameters are whole
        pass


def test_merge_fsdp_weights_and_merge_command_join_dcp_shards(single, tmp_path):
    from safetensors.torch import load_file

    from hpc.commands.merge import merge_command, merge_command_parser

    weights = {"layer.weight": torch.randn(4, 4), "layer.bias": torch.randn(4)}
    dcp.save({"model": weights}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "pytorch_model_fsdp_0")))
    hu.merge_fsdp_weights(tmp_path / "pytorch_model_fsdp_0", tmp_path / "out")
    merged = load_file(tmp_path / "out" / "model.safetensors")
    assert merged.keys() == weights.keys() and all(torch.equal(merged[k], weights[k]) for k in weights)
    merge_command(merge_command_parser().parse_args([str(tmp_path / "pytorch_model_fsdp_0"), str(tmp_path / "bin"),
                                                     "--unsafe-serialization"]))
    assert torch.equal(torch.load(tmp_path / "bin" / "pytorch_model.bin", weights_only=True)["layer.bias"],
                       weights["layer.bias"])
    with pytest.raises(ValueError, match="pytorch_model_fsdp_0"):
        hu.merge_fsdp_weights(tmp_path, tmp_path / "again")  # the folder above: the one to name is said


def test_hf_deepspeed_config_reads_dicts_files_and_base64(tmp_path):
    config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "train_batch_size": 8}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    for given in (config, str(tmp_path / "ds.json"), base64.urlsafe_b64encode(json.dumps(config).encode()).decode()):
        ds = hu.HfDeepSpeedConfig(given)
        assert ds.is_zero3() and ds.is_offload() and ds.get_value("zero_optimization.stage") == 3
        assert ds.get_value("no.such", "dflt") == "dflt" and ds.is_true("zero_optimization.stage")
    ds.del_config_sub_tree("zero_optimization.offload_param")
    assert ds.get_value("zero_optimization.offload_param") is None
    with pytest.raises(ValueError, match="Expected a string path"):
        hu.HfDeepSpeedConfig("not json at all")


def test_write_basic_config_writes_the_file_hpc_launch_reads(tmp_path, capsys):
    from hpc.cluster.config import accelerate_file
    from hpc.commands.config import load_config_from_file

    path = tmp_path / "default_config.yaml"
    assert hu.write_basic_config("bf16", str(path)) == path
    assert hu.write_basic_config("fp16", str(path)) is False and "will not override" in capsys.readouterr().out
    config = load_config_from_file(str(path))
    assert config.mixed_precision == "bf16" and config.distributed_type == "NO"
    assert accelerate_file.translate(str(path)).values["mixed_precision"] == "bf16"
    with pytest.raises(ValueError, match="mixed_precision"):
        hu.write_basic_config("fp64", str(tmp_path / "other.yaml"))


def test_launch_command_parser_takes_accelerates_flags_and_hpc_launch_takes_them_too():
    from hpc.cli.launch_cmd import launch
    from hpc.commands.launch import hpc_launch_argv, launch_command_parser

    args = launch_command_parser().parse_args(["--num-processes", "2", "--mixed_precision", "bf16", "--use_fsdp",
                                               "--fsdp_state_dict_type", "SHARDED_STATE_DICT", "train.py", "--lr",
                                               "3"])
    assert args.num_processes == 2 and args.training_script_args == ["--lr", "3"]
    argv = hpc_launch_argv(args)
    assert argv[1:4] == ["-m", "hpc", "launch"] and argv[-3:] == ["train.py", "--lr", "3"]
    context = launch.make_context("launch", argv[4:])  # every flag is one hpc launch knows
    assert context.params["target"] == "train.py" and context.params["acc_fsdp_state_dict_type"] == \
        "SHARDED_STATE_DICT"
    with pytest.raises(SystemExit):
        launch_command_parser().parse_args(["--mixed_precision", "fp64", "train.py"])
    cmd, env = hu.prepare_simple_launcher_cmd_env(args)
    assert cmd[-3:] == ["train.py", "--lr", "3"] and env["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_test_utils_skip_truthfully_and_launch_through_hpc():
    import importlib.util

    import hpc.test_utils as tu

    def skipped(decorator) -> bool:
        class Case(unittest.TestCase):
            def test_it(self):
                pass

        return bool(getattr(decorator(Case), "__unittest_skip__", False))

    assert skipped(tu.require_tpu) and skipped(tu.require_npu) and not skipped(tu.require_non_torch_xla)
    assert skipped(tu.require_bnb) is (importlib.util.find_spec("bitsandbytes") is None)
    assert skipped(tu.require_cuda) is (not torch.cuda.is_available())
    assert tu.DEFAULT_LAUNCH_COMMAND[:4] == [sys.executable, "-m", "hpc", "launch"]
    assert tu.get_launch_command(num_processes=2, cpu=True, debug=False)[4:] == ["--num_processes=2", "--cpu"]
    ran = tu.execute_subprocess_async([sys.executable, "-c", "print('hi')"], echo=False, quiet=True)
    assert ran.returncode == 0 and ran.stdout == ["hi"]
    with pytest.raises(RuntimeError, match="boom"):
        tu.execute_subprocess_async([sys.executable, "-c", "import sys; sys.exit('boom')"], echo=False, quiet=True)
    with tu.assert_exception(ValueError, "bad"):
        raise ValueError("bad value")


def test_a_kwargs_handler_gives_the_fields_set_away_from_their_defaults():
    from dataclasses import dataclass

    @dataclass
    class Mock(hu.KwargsHandler):
        a: int = 0
        b: bool = False

    assert Mock().to_kwargs() == {} and Mock(a=2, b=True).to_kwargs() == {"a": 2, "b": True}
    assert hu.DistributedDataParallelKwargs(bucket_cap_mb=15).to_kwargs() == {"bucket_cap_mb": 15}
