"""Accelerate's module paths and names as hpc provides them: imports, one real 2-rank run, single-process behaviour."""

import collections
import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from hpc import state as shared_state
from hpc.errors import HpcError

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


# (b) every collective and PartialState feature on two real ranks
SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    from hpc.state import AcceleratorState, DistributedType, PartialState
    from hpc.utils import (broadcast, broadcast_object_list, gather, gather_object, listify, pad_across_processes,
                           reduce, set_seed, synchronize_rng_states, wait_for_everyone)

    out_dir = os.environ["DUMP_DIR"]
    state = PartialState()
    rank = state.process_index
    r = {"facts": [state.num_processes, rank, state.local_process_index, state.is_main_process,
                   state.is_local_main_process, state.is_last_process, state.distributed_type.value,
                   state.use_distributed, state.backend, str(state.device)],
         "shared": PartialState().__dict__ is state.__dict__,
         "accelerator_state": [AcceleratorState().num_processes, AcceleratorState().mixed_precision]}

    r["gather"] = listify(gather(torch.tensor([rank])))
    r["gather_nest"] = listify(gather({"a": torch.tensor([[rank, rank]]), "b": (torch.tensor(rank * 10),)}))
    r["gather_object"] = gather_object([f"r{rank}", rank])
    r["broadcast"] = listify(broadcast({"x": torch.tensor([rank + 5.0])}, from_process=1))
    r["broadcast_object_list"] = broadcast_object_list([f"from{rank}", {"rank": rank}], from_process=1)
    one = torch.tensor([rank + 1.0])
    r["reduce"] = {how: reduce(one, how).item() for how in ("mean", "sum", "max", "min", "none")}
    r["reduce_scaled"] = reduce(one, "sum", scale=0.5).item()
    padded = pad_across_processes(torch.ones(rank + 1, 2), pad_index=-1)
    r["pad"] = listify(gather(padded))
    r["pad_first"] = listify(gather(pad_across_processes(torch.ones(rank + 1, 1), pad_index=-1, pad_first=True)))
    r["pad_dim1"] = list(pad_across_processes(torch.ones(2, rank + 2), dim=1).shape)
    r["pad_mixed"] = [list(t.shape) for t in pad_across_processes([torch.ones(2, rank + 2), torch.ones(2)], dim=1)]

    splits = {}
    for pad in (False, True):
        for name, data in [("list", ["a", "b", "c"]), ("tuple", (1, 2, 3, 4, 5)),
                           ("tensor", torch.arange(5).reshape(5, 1)),
                           ("dict", {"x": [1, 2, 3], "y": torch.tensor([10, 20, 30])}), ("short", ["only"])]:
            with state.split_between_processes(data, apply_padding=pad) as part:
                splits[f"{name}-{pad}"] = gather_object([[rank, listify(part) if not isinstance(part, tuple)
                                                          else ["tuple", list(part)]]])
    r["split"] = splits

    order = os.path.join(out_dir, "order.txt")
    for name, first in (("main", state.main_process_first), ("local", state.local_main_process_first)):
        with first():
            with open(order, "a") as f:
                f.write(f"{name} {rank} enter\\n")
            if rank == 0:
                time.sleep(0.3)  # a main process that is slow still goes first
            with open(order, "a") as f:
                f.write(f"{name} {rank} exit\\n")
    wait_for_everyone()

    decorated = {"main": state.on_main_process(lambda: rank), "local_main": state.on_local_main_process(lambda: rank),
                 "last": state.on_last_process(lambda: rank),
                 "process1": state.on_process(process_index=1)(lambda: rank),
                 "local1": state.on_local_process(local_process_index=1)(lambda: rank)}
    r["decorated"] = {name: gather_object([fn()]) for name, fn in decorated.items()}
    state.print("PRINTED-ONCE")

    set_seed(7, device_specific=True)
    r["device_specific"] = gather_object([torch.rand(1).item()])
    synchronize_rng_states(["torch"])
    r["synchronized"] = gather_object([torch.rand(1).item()])

    from hpc import Accelerator
    from hpc.local_sgd import LocalSGD
    accelerator = Accelerator(cpu=True)  # after PartialState: the same process group
    model = accelerator.prepare(torch.nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        model.module.weight.fill_(1.0)
    with LocalSGD(accelerator, model, local_sgd_steps=2) as local_sgd:
        model(torch.tensor([[rank + 1.0]])).sum().backward()
        r["local_grads"] = gather_object([model.module.weight.grad.item()])  # no all-reduce inside
        with torch.no_grad():
            model.module.weight.fill_(float(rank))
        local_sgd.step()
        r["after_one_step"] = gather_object([model.module.weight.item()])
        local_sgd.step()
        r["after_two_steps"] = gather_object([model.module.weight.item()])

    # what scripts hand the Accelerator's collectives: namedtuples, a tokenizer's BatchEncoding (a UserDict),
    # dataclasses; reduce() sums by default (hpc.utils.reduce means), scale= is taken
    import collections, dataclasses
    Pair = collections.namedtuple("Pair", "a b")

    class Encoding(collections.UserDict):
        pass

    @dataclasses.dataclass
    class Out:
        loss: torch.Tensor
        note: str = "kept"

    pair = accelerator.gather(Pair(torch.tensor([rank]), torch.tensor([rank * 10])))
    enc = accelerator.gather(Encoding(ids=torch.tensor([[rank, rank]])))
    out = accelerator.gather(Out(torch.tensor([rank + 0.5])))
    r["nests"] = {"pair": [type(pair).__name__, listify(pair.a), listify(pair.b)],
                  "encoding": [type(enc).__name__, listify(enc["ids"])],
                  "dataclass": [type(out).__name__, listify(out.loss), out.note],
                  "reduce_default": accelerator.reduce(torch.tensor([rank + 1.0])).item(),
                  "reduce_mean_scaled": accelerator.reduce(torch.tensor([rank + 1.0]), "mean", scale=2.0).item(),
                  "moved": type(accelerator.gather_for_metrics(Pair(torch.tensor([rank]), torch.tensor([0])))).__name__}
    accelerator.end_training()

    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(r, f)
""")


def test_two_ranks(tmp_path):
    (tmp_path / "dumps").mkdir()
    (tmp_path / "names.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "HPC_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "TORCHELASTIC",
                                "ACCELERATE_", "FSDP_"))}
    env.update(DUMP_DIR=str(tmp_path / "dumps"), HF_HOME=str(tmp_path / "hf"), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", "names.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("PRINTED-ONCE") == 1
    r0, r1 = (json.loads((tmp_path / "dumps" / f"rank{i}.json").read_text()) for i in (0, 1))

    assert r0["facts"] == [2, 0, 0, True, True, False, "MULTI_CPU", True, "gloo", "cpu"]
    assert r1["facts"] == [2, 1, 1, False, False, True, "MULTI_CPU", True, "gloo", "cpu"]
    assert r0["shared"] and r0["accelerator_state"] == [2, "no"]

    for r in (r0, r1):
        assert r["gather"] == [0, 1]
        assert r["gather_nest"] == {"a": [[0, 0], [1, 1]], "b": [[0, 10]]}
        assert r["gather_object"] == ["r0", 0, "r1", 1]  # one flat list, rank 0's items first
        assert r["broadcast"] == {"x": [6.0]} and r["broadcast_object_list"] == ["from1", {"rank": 1}]
        assert r["reduce"] == {"mean": 1.5, "sum": 3.0, "max": 2.0, "min": 1.0, "none": 3.0}
        assert r["reduce_scaled"] == 3.0  # scale applies on TPUs only, in Accelerate too
        assert r["pad"] == [[1, 1], [-1, -1], [1, 1], [1, 1]]
        assert r["pad_first"] == [[-1], [1], [1], [1]]
        assert r["pad_dim1"] == [2, 3] and r["pad_mixed"] == [[2, 3], [2]]

    split = r0["split"]
    assert split["list-False"] == [[0, ["a", "b"]], [1, ["c"]]]
    assert split["list-True"] == [[0, ["a", "b"]], [1, ["c", "c"]]]
    assert split["tuple-False"] == [[0, ["tuple", [1, 2, 3]]], [1, ["tuple", [4, 5]]]]
    assert split["tuple-True"] == [[0, ["tuple", [1, 2, 3]]], [1, ["tuple", [4, 5, 5]]]]
    assert split["tensor-False"] == [[0, [[0], [1], [2]]], [1, [[3], [4]]]]
    assert split["tensor-True"] == [[0, [[0], [1], [2]]], [1, [[3], [4], [4]]]]
    assert split["dict-False"] == [[0, {"x": [1, 2], "y": [10, 20]}], [1, {"x": [3], "y": [30]}]]
    assert split["dict-True"] == [[0, {"x": [1, 2], "y": [10, 20]}], [1, {"x": [3, 3], "y": [30, 30]}]]
    assert split["short-False"] == [[0, ["only"]], [1, []]]
    assert split["short-True"] == [[0, ["only"]], [1, ["only"]]]

    order = (tmp_path / "dumps" / "order.txt").read_text().splitlines()
    for name in ("main", "local"):
        assert [line for line in order if line.startswith(name)][:2] == [f"{name} 0 enter", f"{name} 0 exit"]

    assert r0["decorated"] == {"main": [0, None], "local_main": [0, None], "last": [None, 1], "process1": [None, 1],
                               "local1": [None, 1]}
    assert r0["device_specific"][0] != r0["device_specific"][1]
    assert r0["synchronized"][0] == r0["synchronized"][1]
    for r in (r0, r1):
        assert r["nests"] == {"pair": ["Pair", [0, 1], [0, 10]], "encoding": ["Encoding", [[0, 0], [1, 1]]],
                              "dataclass": ["Out", [0.5, 1.5], "kept"], "reduce_default": 3.0,
                              "reduce_mean_scaled": 1.5, "moved": "Pair"}
    assert r0["local_grads"] == [1.0, 2.0]  # each rank's own gradient: LocalSGD turned the all-reduce off
    assert r0["after_one_step"] == [0.0, 1.0] and r0["after_two_steps"] == [0.5, 0.5]


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

    page = (Path(__file__).resolve().parent.parent / "docs" / "training.md").read_text()
    section = page.split("## Porting from Accelerate", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:4] for line in section.splitlines() if line.startswith("| `accelerate")]
    assert len(rows) == 8
    for module_cell, there, _ in rows:
        module = "hpc" + module_cell.strip().strip("`").removeprefix("accelerate")
        names = re.findall(r"`([A-Za-z_]+)`", there)
        assert names, module
        imported = importlib.import_module(module)
        missing = [n for n in names if not hasattr(imported, n)]
        assert not missing, f"{module} lacks {missing}"
