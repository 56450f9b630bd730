"""Megatron-LM's layout, one process: the plugin's settings (code and MEGATRON_LM_* variables), its refusals by
name, MegatronLMDummyScheduler's learning rate beside transformers' linear schedule, the even stage split, and the
sizing of `hpc estimate-memory --pp`."""

import pytest

from hpc.errors import HpcError


def test_the_plugin_reads_the_variables_accelerates_launcher_sets(monkeypatch):
    from hpc.utils.megatron_lm import MegatronLMPlugin

    for name, value in {"TP_DEGREE": "2", "PP_DEGREE": "4", "NUM_MICRO_BATCHES": "8", "SEQUENCE_PARALLELISM": "true",
                        "USE_DISTRIBUTED_OPTIMIZER": "True", "RECOMPUTE_ACTIVATIONS": "false",
                        "GRADIENT_CLIPPING": "0.5"}.items():
        monkeypatch.setenv(f"MEGATRON_LM_{name}", value)
    plugin = MegatronLMPlugin()
    assert (plugin.tp_degree, plugin.pp_degree, plugin.num_micro_batches, plugin.sequence_parallelism,
            plugin.use_distributed_optimizer, plugin.recompute_activations, plugin.gradient_clipping,
            plugin.pipeline_schedule) == (2, 4, 8, True, True, False, 0.5, "1f1b")
    assert MegatronLMPlugin(tp_degree=1, pp_degree=1).num_micro_batches == 1  # micro-batches are the pipeline's
    monkeypatch.setenv("MEGATRON_LM_NUM_LAYERS_PER_VIRTUAL_PIPELINE_STAGE", "3")
    assert MegatronLMPlugin().num_layers_per_virtual_pipeline_stage == 3


@pytest.mark.parametrize("layers,per,schedule,expected", [
    (8, None, "1f1b", ("1f1b", 1)),
    (8, 2, "1f1b", ("interleaved_1f1b", 2)),  # Megatron-LM's: virtual stages mean the interleaved schedule
    (8, 1, "looped_bfs", ("looped_bfs", 4)),
    (8, None, "interleaved_1f1b", ("interleaved_1f1b", 2)),  # named alone: two stages per rank
    (8, 4, "1f1b", ("1f1b", 1)),  # 4 layers a virtual stage over pp 2 is one stage a rank
])
def test_virtual_stages_come_from_the_layers_per_virtual_stage_and_pick_the_schedule(layers, per, schedule, expected):
    from hpc.runtime.strategies.megatron import MegatronStrategy
    from hpc.utils.megatron_lm import MegatronLMPlugin

    strategy = MegatronStrategy.__new__(MegatronStrategy)  # the schedule choice alone: no process group
    strategy.sizes = {"pp": 2}
    strategy.plugin = MegatronLMPlugin(pp_degree=2, num_layers_per_virtual_pipeline_stage=per,
                                       pipeline_schedule=schedule)
    assert strategy._schedule(layers) == expected


@pytest.mark.parametrize("per,schedule,words", [
    (3, "1f1b", "num_layers_per_virtual_pipeline_stage 3 x pp_degree 2 does not divide the model's 8 blocks"),
    (1, "gpipe", "pipeline schedule gpipe runs one stage per rank"),
])
def test_virtual_stages_that_do_not_fit_are_one_line(per, schedule, words):
    from hpc.runtime.strategies.megatron import MegatronStrategy
    from hpc.utils.megatron_lm import MegatronLMPlugin

    strategy = MegatronStrategy.__new__(MegatronStrategy)
    strategy.sizes = {"pp": 2}
    strategy.plugin = MegatronLMPlugin(pp_degree=2, num_layers_per_virtual_pipeline_stage=per,
                                       pipeline_schedule=schedule)
    with pytest.raises(HpcError) as e:
        strategy._schedule(8)
    assert words in str(e.value).splitlines()[0]


@pytest.mark.parametrize("kwargs,words", [
    ({"tp_degree": 0}, "tp_degree=0) must be a whole number >= 1"),
    ({"num_layers_per_virtual_pipeline_stage": 0}, "num_layers_per_virtual_pipeline_stage=0) must be a whole number"),
    ({"pipeline_schedule": "zigzag"}, "pipeline_schedule='zigzag') is not a pipeline schedule hpc runs"),
])
def test_a_plugin_hpc_cannot_lay_out_is_one_line(kwargs, words):
    from hpc.utils.megatron_lm import MegatronLMPlugin

    with pytest.raises(HpcError) as e:
        MegatronLMPlugin(**kwargs)
    assert words in str(e.value).splitlines()[0]


def test_megatron_lm_only_names_exist_and_say_what_to_use():
    from hpc.utils import megatron_lm

    with pytest.raises(HpcError, match="Megatron-LM's own"):
        megatron_lm.GPTTrainStep(None, None)
    with pytest.raises(HpcError, match="torch DataLoader"):
        megatron_lm.MegatronLMDummyDataLoader(data_path=["x"])
    with pytest.raises(HpcError, match="prepare"):
        megatron_lm.megatron_lm_prepare_data_loader(None, None)
    plugin = megatron_lm.MegatronLMPlugin(custom_train_step_class=object)
    with pytest.raises(HpcError, match="custom_train_step_class"):
        plugin.check_supported()


def test_the_dummy_scheduler_gives_the_non_megatron_branchs_learning_rate():
    """run_clm_no_trainer's two branches: MegatronLMDummyScheduler(total, warmup), stepped once an update, and
    get_scheduler("linear", warmup x processes, total x processes), stepped once per process an update."""
    import torch
    import transformers

    from hpc.utils.megatron_lm import MegatronLMDummyScheduler

    processes, total, warmup = 4, 10, 3
    ours = MegatronLMDummyScheduler(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), total, warmup)
    theirs = transformers.get_scheduler("linear", torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0),
                                        num_warmup_steps=warmup * processes, num_training_steps=total * processes)
    for _ in range(total):
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr())
        ours.step()
        for _ in range(processes):
            theirs.step()


def test_stages_take_the_blocks_evenly_the_first_ones_the_remainder():
    from hpc.runtime.parallel.pipeline import stage_layers

    assert [list(stage_layers(10, 4, s)) for s in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    with pytest.raises(HpcError, match="more than the model's 2 blocks"):
        stage_layers(2, 4, 0)


def test_estimate_memory_divides_the_state_by_the_pipeline_stages():
    from hpc.cluster.estimate import estimate

    flat = estimate(8_000_000_000, "fsdp", world_size=16, tp=2)
    piped = estimate(8_000_000_000, "fsdp", world_size=16, tp=2, pp=4)
    assert piped.strategy == "fsdp (pp 4, tp 2)" and piped.state_bytes == flat.state_bytes
    # the same 16 ranks: pp 4 x tp 2 leaves 2 data ranks; per rank each holds 1/16 of the state either way
    no_dp = estimate(8_000_000_000, "fsdp", world_size=8, tp=2, pp=4)
    assert no_dp.params == 4 * 8_000_000_000 // 8
    with pytest.raises(HpcError, match="does not divide 12 GPU"):
        estimate(8_000_000_000, "fsdp", world_size=12, tp=2, pp=4)
