"""Accelerate's module paths and names as hpc provides them: imports and single-process behaviour (the real
2-rank run is tests/test_accelerate_names.py)."""

import collections
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from hpc.errors import HpcError
from hpc.runtime.process import state as shared_state

# (a) what an Accelerate script imports, with `accelerate` spelled `hpc`
IMPORTS = textwrap.dedent("""
    from hpc import (Accelerator, DataLoaderConfiguration, DeepSpeedPlugin, DistributedDataParallelKwargs,
                     DistributedType, FullyShardedDataParallelPlugin, GradScalerKwargs, PartialState,
                     find_executable_batch_size, set_seed, skip_first_batches, synchronize_rng_states)
    from hpc.accelerator import Accelerator as A2
    from hpc.data_loader import skip_first_batches as s2
    from hpc.local_sgd import LocalSGD
    from hpc.logging import get_logger
    from hpc.state import AcceleratorState, DistributedType as D2, GradientState, PartialState as P2, is_initialized
    from hpc.utils import (DataLoaderConfiguration as DLC, DeepSpeedPlugin as DSP,
                           DistributedDataParallelKwargs as DDPK, DistributedType as D3,
                           FullyShardedDataParallelPlugin as FSDPP, GradScalerKwargs as GSK,
                           GradientAccumulationPlugin, ProjectConfiguration, RNGType, broadcast, broadcast_object_list,
                           clear_device_cache, concatenate, find_batch_size,
                           find_executable_batch_size as f2, gather, gather_object, honor_type, is_cuda_available,
                           is_deepspeed_available, is_namedtuple, is_torch_tensor, listify, pad_across_processes,
                           recursively_apply, reduce, release_memory, send_to_device, set_seed as s3, slice_tensors,
                           synchronize_rng_state, wait_for_everyone)
    from hpc.utils.dataclasses import (DistributedType as D4, GradientAccumulationPlugin as G2,
                                       ProjectConfiguration as P3)
    from hpc.utils.memory import find_executable_batch_size as f3, release_memory as r2
    from hpc.utils.operations import gather as g2, pad_across_processes as p2, reduce as r3, send_to_device as sd2
    from hpc.utils.random import set_seed as s4, synchronize_rng_states as sr2
    import hpc.utils
    assert A2 is Accelerator and s2 is skip_first_batches and D2 is D3 is D4 is DistributedType and P2 is PartialState
    assert set_seed is s3 is s4 and f2 is f3 is find_executable_batch_size and g2 is gather
    assert G2 is GradientAccumulationPlugin and P3 is ProjectConfiguration and DLC is DataLoaderConfiguration
    assert DistributedType.MULTI_GPU == "MULTI_GPU"
    assert [t.value for t in DistributedType][:3] == ["NO", "MULTI_CPU", "MULTI_GPU"]
    assert {"FSDP", "DEEPSPEED", "XLA", "MEGATRON_LM"} <= {t.value for t in DistributedType}
    assert set(hpc.utils.__all__) <= set(dir(hpc.utils))
    print("IMPORTED")
""")


def test_accelerate_import_paths():
    proc = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "IMPORTED"


def test_import_hpc_stays_light():
    code = ("import sys, hpc; hpc.__dir__(); "
            "print(sorted(m for m in ('torch', 'hpc.state', 'hpc.utils') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


# (b) every collective and PartialState feature on two real ranks: tests/test_accelerate_names.py


# (c) one process
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


def test_single_process_state(single):
    from hpc.state import AcceleratorState, DistributedType, PartialState

    assert PartialState().__dict__ is single.__dict__
    facts = (single.num_processes, single.process_index, single.is_main_process, single.is_last_process)
    assert facts == (1, 0, True, True)
    assert single.distributed_type == DistributedType.NO and not single.use_distributed and single.backend is None
    assert single.on_process(process_index=3)(lambda: "ran")() == "ran"  # one process runs everything, as Accelerate
    with single.split_between_processes({"x": [1, 2, 3]}, apply_padding=True) as part:
        assert part == {"x": [1, 2, 3]}
    assert AcceleratorState().mixed_precision == "no" and not AcceleratorState().initialized
    with pytest.raises(HpcError, match="not supported by hpc"):
        PartialState._reset_state()
        PartialState(timeout=5)
    with pytest.raises(HpcError, match="needs process_index"):
        PartialState().on_process(lambda: None)


def test_single_process_collectives(single):
    from hpc.utils import (
        broadcast_object_list,
        concatenate,
        find_batch_size,
        gather,
        gather_object,
        reduce,
        send_to_device,
    )

    t = torch.tensor([1.0, 2.0])
    assert gather(t) is t and gather_object([1, 2]) == [1, 2] and broadcast_object_list(["a"], 0) == ["a"]
    reduced = reduce(t, "mean")
    assert reduced is not t and reduced.tolist() == [1.0, 2.0] and reduce(t, "sum", scale=2.0).tolist() == [1.0, 2.0]
    with pytest.raises(HpcError, match="reduction='avg'"):
        reduce(t, "avg")
    nest = {"a": t, "b": "text"}
    assert gather(nest) is nest  # one process holds everything already: returned as it is, as Accelerate's
    with pytest.raises(HpcError, match="wrap it"):
        gather_object("abc")
    with pytest.raises(HpcError, match="from_process=1"):
        broadcast_object_list(["a"], from_process=1)
    Pair = collections.namedtuple("Pair", "x y")
    moved = send_to_device({"p": Pair(t, "keep"), "ids": [t]}, "cpu", skip_keys="ids")
    assert isinstance(moved["p"], Pair) and moved["p"].y == "keep" and moved["ids"][0] is t
    joined = concatenate([{"a": torch.ones(2, 1)}, {"a": torch.zeros(3, 1)}])
    assert joined["a"].shape == (5, 1) and find_batch_size([("x", torch.ones(4, 2))]) == 4


def test_set_seed_is_deterministic(single, monkeypatch):
    from hpc.utils import set_seed

    def draw():
        return random.random(), torch.rand(3).tolist()

    set_seed(11)
    first = draw()
    set_seed(11)
    assert draw() == first
    set_seed(11, device_specific=True)  # rank 0 of one: the same seed
    assert draw() == first
    set_seed(12)
    assert draw() != first
    asked = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", asked.append)  # torch's own switch costs 2 s
    set_seed(11, deterministic=True)
    assert asked == [True] and draw() == first
    with pytest.raises(HpcError, match="whole number"):
        set_seed("11")


def test_find_executable_batch_size_shrinks_on_out_of_memory():
    from hpc.utils import find_executable_batch_size

    tried = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, scale):
        tried.append(batch_size)
        if batch_size > 100:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if batch_size > 95:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1024 bytes.")
        return batch_size * scale

    assert train(2) == 184 and tried == [128, 115, 103, 92]  # x0.9 each time, as Accelerate 1.14+
    assert train(1) == 92 and tried[-1] == 92  # the size that fit is kept

    halves = {"size": 64}

    def halve():
        halves["size"] //= 2
        return halves["size"]

    @find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=halve)
    def halving(batch_size):
        if batch_size > 16:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")
        return batch_size

    assert halving() == 16

    @find_executable_batch_size(starting_batch_size=2)
    def never_fits(batch_size):
        raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB")

    with pytest.raises(HpcError, match="every batch size down to 1"):
        never_fits()

    @find_executable_batch_size(starting_batch_size=8)
    def broken(batch_size):
        raise ValueError("not a memory problem")

    with pytest.raises(ValueError, match="not a memory problem"):
        broken()
    with pytest.raises(HpcError, match="called with the batch size"):
        train(64, 2)


def test_release_memory_drops_the_last_references():
    import weakref

    from hpc.utils import release_memory

    a, b = torch.ones(1000), torch.nn.Linear(2, 2)
    watch = weakref.ref(b)
    a, b = release_memory(a, b)
    assert (a, b) == (None, None) and watch() is None


def test_skip_first_batches_of_a_plain_loader():
    from torch.utils.data import DataLoader

    from hpc import skip_first_batches

    rest = skip_first_batches(DataLoader(list(range(10)), batch_size=3), num_batches=2)
    assert len(rest) == 2 and [b.tolist() for b in rest] == [[6, 7, 8], [9]]
    with pytest.raises(HpcError, match="num_batches=-1"):
        skip_first_batches(DataLoader([1]), -1)


def test_accelerator_state_reads_a_registered_accelerator(single):
    from hpc import Accelerator
    from hpc.state import AcceleratorState, PartialState, attach_accelerator

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    attach_accelerator(accelerator)  # what Accelerator.__init__ is to call (see the report)
    assert AcceleratorState().initialized and AcceleratorState().mixed_precision == "bf16"
    assert PartialState().distributed_type.value == "NO" and AcceleratorState().fsdp_plugin is None
    with pytest.raises(HpcError, match="differs from the Accelerator"):
        AcceleratorState(mixed_precision="fp16")
    accelerator.end_training()


def test_without_a_mesh_maybe_context_parallel_leaves_the_buffers_and_the_mesh_ranks_need_a_config(single):
    from hpc import Accelerator

    accelerator = Accelerator(cpu=True)
    ids = torch.arange(8).reshape(1, 8)
    with accelerator.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1]):
        assert ids.shape == (1, 8)  # Accelerate's: no cp_size > 1, no split (a warning once)
    for name in ("tensor_parallel_rank", "context_parallel_rank", "data_parallel_rank", "pipeline_parallel_rank"):
        with pytest.raises(HpcError):
            getattr(accelerator, name)
    assert accelerator.is_composable_parallelism_enabled is False
    accelerator.end_training()


def test_local_sgd_is_off_with_one_process(single):
    from hpc import Accelerator
    from hpc.local_sgd import LocalSGD

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    with LocalSGD(accelerator, model, local_sgd_steps=1) as local_sgd:
        local_sgd.step()
    assert not local_sgd.enabled and local_sgd.num_steps == 1
    with pytest.raises(HpcError, match="local_sgd_steps=0"):
        LocalSGD(accelerator, model, local_sgd_steps=0)
    accelerator.end_training()


def test_every_name_the_porting_table_lists_as_there_imports_from_hpc():
    import importlib
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    section = page.split("## Porting from Accelerate", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:4] for line in section.splitlines() if line.startswith("| `accelerate")]
    assert len(rows) == 11
    for module_cell, there, _ in rows:
        module = "hpc" + module_cell.strip().strip("`").removeprefix("accelerate")
        names = re.findall(r"`([A-Za-z_]+)`", there)
        assert names, module
        imported = importlib.import_module(module)
        missing = [n for n in names if not hasattr(imported, n)]
        assert not missing, f"{module} lacks {missing}"


PREPARED_TYPES = textwrap.dedent("""
    import torch
    from hpc import Accelerator
    from hpc.memory_utils import find_executable_batch_size, release_memory
    from hpc.optimizer import AcceleratedOptimizer
    from hpc.scheduler import AcceleratedScheduler
    from hpc.utils import find_executable_batch_size as f2, release_memory as r2
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, sched = acc.prepare(model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1))
    assert isinstance(opt, AcceleratedOptimizer) and isinstance(sched, AcceleratedScheduler)
    assert f2 is find_executable_batch_size and r2 is release_memory
    print("TYPES")
""")


def test_accelerates_optimizer_scheduler_and_memory_utils_paths_name_what_prepare_returns():
    """`from accelerate.optimizer import AcceleratedOptimizer` (isinstance checks in trainers), `accelerate.scheduler`
    and the older `accelerate.memory_utils`, with `accelerate` spelled `hpc`."""
    proc = subprocess.run([sys.executable, "-c", PREPARED_TYPES], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "TYPES", proc.stderr


def test_save_and_load_state_take_accelerates_arguments_and_refuse_what_would_loosen_a_load(single, tmp_path):
    """Accelerate's save_state(output_dir, safe_serialization=True, **save_model_func_kwargs) and
    load_state(input_dir, load_kwargs=None, **load_model_func_kwargs): a script passing them runs (it raised a
    TypeError); hpc's one checkpoint format is checksummed and weights_only whichever is asked, and a load that
    would be loosened (strict=False, weights_only=False) is refused in one line rather than quietly tightened."""
    from hpc import Accelerator

    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path))
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    before = model.weight.detach().clone()
    accelerator.save_state(str(tmp_path / "a"), safe_serialization=False)
    accelerator.save_state(str(tmp_path / "b"), True)  # Accelerate's second parameter, given by position
    with torch.no_grad():
        model.weight.add_(1.0)
    accelerator.load_state(str(tmp_path / "a"), load_kwargs={"weights_only": True, "map_location": "cpu"},
                           strict=True)
    assert torch.equal(model.weight, before)
    for kwargs, said in (({"strict": False}, "strict=False"),
                         ({"load_kwargs": {"weights_only": False}}, "weights_only=False")):
        with pytest.raises(HpcError, match=f"load_state\\({said}\\): hpc loads checkpoints strictly"):
            accelerator.load_state(str(tmp_path / "b"), **kwargs)
    accelerator.end_training()
