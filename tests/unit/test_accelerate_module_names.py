"""accelerate.tracking's registry, accelerate.state's helpers, accelerate.checkpointing's functions and
accelerate.inference's pippy steps, in one process."""

import os
import threading

import pytest
import torch

from hpc.errors import HpcError
from hpc.runtime.process import state as shared_state


@pytest.fixture
def one_process(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "ACCELERATE_", "TORCHELASTIC")):
            monkeypatch.delenv(key)
    shared_state.PartialState._reset_state()
    yield
    shared_state.PartialState._reset_state()


def test_tracker_registry_names_registered_classes_and_refuses_missing_packages(tmp_path):
    from hpc.runtime.tracking import trackers
    from hpc.tracking import (
        LOGGER_TYPE_TO_CLASS,
        GeneralTracker,
        SwanLabTracker,
        TrackioTracker,
        filter_trackers,
        register_tracker_class,
    )

    accelerates = {"aim", "comet_ml", "mlflow", "tensorboard", "wandb", "clearml", "dvclive", "swanlab", "trackio"}
    assert accelerates <= set(LOGGER_TYPE_TO_CLASS) and LOGGER_TYPE_TO_CLASS is trackers.TRACKERS

    class Mine(GeneralTracker):
        name = "mine_for_test"
        requires_logging_directory = True

    register_tracker_class(Mine)
    try:
        assert trackers.resolve(["mine_for_test"])[-1] is Mine  # what log_with starts
        assert filter_trackers(["mine_for_test", "swanlab"], logging_dir=tmp_path) == ["mine_for_test"]
        with pytest.raises(HpcError, match="needs a logging directory"):
            filter_trackers("mine_for_test")
    finally:
        del LOGGER_TYPE_TO_CLASS["mine_for_test"]
    with pytest.raises(ValueError, match="subclass of `GeneralTracker`"):
        register_tracker_class(object)
    for cls in (SwanLabTracker, TrackioTracker):
        with pytest.raises(HpcError, match=f"needs the {cls.package} package, which is not installed"):
            cls(tmp_path, "run", None)
    with pytest.raises(HpcError, match="the trackio package is not installed"):
        trackers.resolve(["trackio"])


def test_state_helpers():
    from hpc.state import SharedDict, ThreadLocalSharedDict, do_nothing

    assert SharedDict is dict and do_nothing(1, x=2) is None  # no XLA: one dict per process

    class Holder:
        shared = ThreadLocalSharedDict()

    Holder.shared["main"] = 1
    seen = []
    thread = threading.Thread(target=lambda: seen.append(dict(Holder().shared)))
    thread.start()
    thread.join()
    assert Holder().shared == {"main": 1} and seen == [{}]  # another thread has its own


def test_accelerator_state_files_round_trip_and_refuse_pickles(one_process, tmp_path):
    from hpc.checkpointing import load_accelerator_state, load_custom_state, save_accelerator_state, save_custom_state
    from hpc.data_loader import prepare_data_loader

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # no opt.step(): torch's first one imports dynamo (seconds); the state is given instead
    opt.state[model.weight]["momentum_buffer"] = torch.full((2, 3), 0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    loader = prepare_data_loader(torch.utils.data.DataLoader(list(range(12)), batch_size=2))
    next(iter(loader))
    save_accelerator_state(tmp_path, [model.state_dict()], [opt], [sched], [loader], 0, step=7)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"model.safetensors", "optimizer.bin", "scheduler.bin", "dl_state_dict.bin", "random_states_0.pkl"}
    drawn = torch.rand(3)

    model2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1)
    loader2 = prepare_data_loader(torch.utils.data.DataLoader(list(range(12)), batch_size=2))
    assert load_accelerator_state(tmp_path, [model2], [opt2], [sched2], [loader2], 0) == {"step": 7}
    assert torch.equal(model2.weight, model.weight) and sched2.last_epoch == 1
    assert torch.equal(opt2.state[model2.weight]["momentum_buffer"], torch.full((2, 3), 0.5))
    assert opt2.param_groups[0]["lr"] == 0.05
    assert torch.equal(torch.rand(3), drawn)  # the random state is the one saved
    assert loader2.epoch == 0  # the top of the saved epoch, as Accelerate's load_state

    save_custom_state(sched, tmp_path, index=1)
    load_custom_state(sched2, tmp_path, index=1)
    torch.save({"f": print}, tmp_path / "custom_checkpoint_2.pkl")
    with pytest.raises(HpcError, match="custom_checkpoint_2.pkl"):
        load_custom_state(sched2, tmp_path, index=2)


def test_pippy_steps_on_one_process(one_process):
    from hpc.inference import find_pippy_batch_size, generate_device_map, pippy_forward

    assert find_pippy_batch_size((), {"x": {"ids": torch.zeros(5, 2)}}) == 5
    assert find_pippy_batch_size((torch.tensor(1.0),), None) is None
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    stages = generate_device_map(model, num_processes=2, max_memory={0: 60_000, 1: 60_000})
    assert list(stages.values())[0] == 0 and 1 in stages.values()  # in order: stage 0 first, then stage 1
    assert pippy_forward(lambda x: x * 2, 2, False, torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
