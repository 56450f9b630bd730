"""Accelerate's names as hpc provides them, on two real ranks (imports and single-process behaviour:
tests/unit/test_accelerate_names.py)."""

import json
import os
import subprocess
import sys
import textwrap

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
