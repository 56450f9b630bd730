"""Accelerator methods of Accelerate's API on 2 real ranks: save_model (safetensors, shards, an index), save,
gather_for_metrics of objects, set_trigger/check_trigger, the on_* decorators, split_between_processes, and
nests (a namedtuple, a UserDict, a Mapping) through gather, reduce, pad_across_processes and send_to_device."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.jobhelpers import launch_env

WORKER = textwrap.dedent("""
    import json, sys
    import torch
    from hpc import Accelerator
    from hpc.utils import DistributedType

    from datetime import timedelta
    from hpc.utils import (AutocastKwargs, DDPCommunicationHookType, DistributedDataParallelKwargs,
                           InitProcessGroupKwargs, ProfileKwargs)

    acc = Accelerator(mixed_precision="bf16", log_with="tensorboard", project_dir=sys.argv[1] + "/proj",
                      kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=90)),
                                       DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16),
                                       AutocastKwargs(enabled=False)])
    out = {"type_is_enum": acc.distributed_type == DistributedType.MULTI_CPU, "last": acc.is_last_process}
    try:
        Accelerator(kwargs_handlers=[object()])
    except Exception as e:
        out["unknown_handler"] = str(e)
    linear = acc.prepare(torch.nn.Linear(2, 2))
    out["comm_hook"] = linear._get_ddp_logging_data().get("comm_hook")
    out["autocast_off_dtype"] = str(linear(torch.ones(1, 2)).dtype)  # AutocastKwargs(enabled=False)
    with acc.autocast(AutocastKwargs(enabled=True)):
        out["autocast_on_dtype"] = str(torch.nn.functional.linear(torch.ones(1, 2), torch.ones(2, 2)).dtype)
    with acc.profile(ProfileKwargs(output_trace_dir=sys.argv[1] + "/traces", record_shapes=True)) as prof:
        torch.ones(64, 64) @ torch.ones(64, 64)
    out["profiled"] = any("aten::mm" in e.key for e in prof.key_averages())

    class ScheduleFree(torch.optim.SGD):  # schedule-free optimizers swap weights in train() and eval()
        calls = []
        def train(self): self.calls.append("train")
        def eval(self): self.calls.append("eval")

    opt = acc.prepare(ScheduleFree(linear.parameters(), lr=0.1))
    opt.eval(); opt.train()
    out["optimizer_modes"] = ScheduleFree.calls
    out["facts"] = [acc.use_distributed, acc.split_batches, acc.even_batches, acc.is_fsdp2, acc.multi_device]
    m2 = acc.prepare_model(torch.nn.Linear(2, 1))
    o2 = acc.prepare_optimizer(torch.optim.SGD(m2.parameters(), lr=0.1))
    with acc.join_uneven_inputs([m2]):  # rank 1 runs out of data a step early: rank 0's last step must not hang
        for _ in range(3 - acc.process_index):
            o2.zero_grad()
            m2(torch.ones(1, 2)).sum().backward()
            o2.step()
    with acc.no_sync(m2), acc.trigger_sync_in_backward(m2):  # all-reduced after all
        o2.zero_grad()
        m2(torch.ones(1, 2) * (acc.process_index + 1)).sum().backward()
    out["synced_grad"] = acc.gather(m2.module.weight.grad.reshape(1, -1)).tolist()
    acc.init_trackers("run")
    out["tracker"] = type(acc.get_tracker("tensorboard", unwrap=True)).__name__
    acc.get_tracker("wandb").log({"x": 1})  # not started: does nothing
    acc.free_memory()
    out["freed"] = [len(acc.training.models), len(acc.training.optimizers)]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 10, bias=False))
    model[2].weight = model[0].weight  # tied, as language models tie input and output embeddings
    model = acc.prepare(model)
    acc.save_model(model, sys.argv[1] + "/one")
    acc.save_model(model, sys.argv[1] + "/shards", max_shard_size="100B")
    acc.save_model(model, sys.argv[1] + "/bin", safe_serialization=False)
    acc.save({"step": 7}, sys.argv[1] + "/extra.pt")
    # objects: every rank's items, in rank order, one flat list
    out["objects"] = acc.gather_for_metrics([f"sample-{acc.process_index}-{i}" for i in range(2)])
    out["one_object"] = acc.gather_for_metrics({"rank": acc.process_index}, use_gather_object=True)
    if acc.process_index == 1:
        acc.set_trigger()
    out["trigger"] = [acc.check_trigger(), acc.check_trigger()]  # seen everywhere once, then reset
    ran = []
    acc.on_process(lambda: ran.append("p1"), process_index=1)()
    acc.on_last_process(lambda: ran.append("last"))()
    acc.on_main_process(lambda: ran.append("main"))()
    acc.on_local_main_process(lambda: ran.append("local-main"))()
    out["ran"] = acc.gather_for_metrics([ran], use_gather_object=True)
    with acc.split_between_processes(list(range(5)), apply_padding=True) as mine:
        out["split"] = acc.gather_for_metrics([mine], use_gather_object=True)
    # a namedtuple, a UserDict and a Mapping that is no dict keep their type through every collective, both doors
    import collections
    from collections.abc import Mapping
    from hpc.utils import gather, listify, pad_across_processes, reduce, send_to_device

    class Frozen(Mapping):
        def __init__(self, data): self._data = dict(data)
        def __getitem__(self, key): return self._data[key]
        def __iter__(self): return iter(self._data)
        def __len__(self): return len(self._data)

    def seen(got):
        return [type(got).__name__, listify(dict(got._asdict() if isinstance(got, tuple) else got))]

    r, out["nests"] = acc.process_index, {}
    for kind in (collections.namedtuple("Pair", "a b"), collections.UserDict, Frozen):
        mine = {"a": torch.tensor([r + 1.0]), "b": torch.full((1, r + 1), r)}
        data = kind(**mine) if kind.__name__ == "Pair" else kind(mine)
        padded = acc.pad_across_processes(data, dim=1, pad_index=-1)  # b padded; a has no dim 1 and is kept
        out["nests"][kind.__name__] = [
            seen(padded), seen(acc.gather(padded)), seen(acc.reduce(padded)),
            seen(gather(send_to_device(pad_across_processes(data, dim=1, pad_index=-1), acc.device))),
            seen(reduce(padded, "max"))]
    if acc.is_main_process:
        json.dump(out, open(sys.argv[1] + "/out.json", "w"))
""")


UNEVEN = textwrap.dedent("""
    import json, sys
    import torch
    from hpc import Accelerator, DataLoaderConfiguration

    acc = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
    torch.manual_seed(3)
    model = acc.prepare(torch.nn.Linear(8, 1))
    opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.05))
    x = torch.randn(50, 8)
    loader = acc.prepare(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)),
                                                     batch_size=4))
    taken = 0
    with acc.join_uneven_inputs([model]):
        for xb, yb in loader:
            acc.backward(torch.nn.functional.mse_loss(model(xb), yb))
            opt.step()
            opt.zero_grad()
            taken += 1
    out = [acc.gather(torch.tensor([taken])).tolist(), acc.gather(model.module.weight.detach()).tolist(),
           acc.should_stop]
    if acc.is_main_process:
        json.dump(out, open(sys.argv[1], "w"))
""")


def test_uneven_batches_join_without_pairing_hpcs_stop_vote_with_ddps_shadow_collectives(tmp_path):
    # 13 batches over 3 ranks: rank 0 takes 5, the others 4 and then run DDP's shadow collectives only; a stop vote
    # of rank 0's paired with one of them (a wrong-sized all-reduce: gloo aborted the job)
    (tmp_path / "uneven.py").write_text(UNEVEN)
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "3", "uneven.py", "out.json"],
                          cwd=tmp_path, env=launch_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts, weights, stop = json.loads((tmp_path / "out.json").read_text())
    assert counts == [5, 4, 4] and weights[0] == weights[1] == weights[2] and stop is False


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("methods")
    (tmp / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "ACCELERATE_"))}
    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", "worker.py", str(tmp)], cwd=tmp,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp, json.loads((tmp / "out.json").read_text()), proc.stdout


def test_collective_helpers_and_decorators(run):
    _, out, _ = run
    assert out["type_is_enum"] is True
    assert out["objects"] == ["sample-0-0", "sample-0-1", "sample-1-0", "sample-1-1"]
    assert out["one_object"] == [{"rank": 0}, {"rank": 1}]
    assert out["trigger"] == [True, False]
    assert out["ran"] == [["main", "local-main"], ["p1", "last"]]
    assert out["split"] == [[0, 1, 2], [3, 4, 4]]  # padded with the last item so both hold 3
    assert "kwargs_handlers: object is not a handler hpc applies" in out["unknown_handler"]
    assert out["comm_hook"] == "fp16_compress_hook"
    assert (out["autocast_off_dtype"], out["autocast_on_dtype"]) == ("torch.float32", "torch.bfloat16")
    assert out["profiled"] and out["optimizer_modes"] == ["eval", "train"]
    assert out["tracker"] == "SummaryWriter" and out["freed"] == [0, 0]
    assert out["facts"] == [True, False, True, False, False]
    assert out["synced_grad"] == [[1.5, 1.5], [1.5, 1.5]]  # the mean of rank 0's 1 and rank 1's 2


def test_nests_keep_their_type_through_the_collectives(run):
    _, out, _ = run
    for kind in ("Pair", "UserDict", "Frozen"):
        padded, gathered, summed, utils_gathered, utils_max = out["nests"][kind]
        assert padded == [kind, {"a": [1.0], "b": [[0, -1]]}]  # rank 0's
        assert gathered == utils_gathered == [kind, {"a": [1.0, 2.0], "b": [[0, -1], [1, 1]]}]
        assert summed == [kind, {"a": [3.0], "b": [[1, 0]]}]  # the Accelerator's reduce sums
        assert utils_max == [kind, {"a": [2.0], "b": [[1, 1]]}]


def test_profile_writes_a_trace_per_rank(run):
    tmp, _, _ = run
    assert sorted(p.name for p in (tmp / "traces").iterdir()) == ["trace_rank_0.json", "trace_rank_1.json"]


def test_save_model_writes_safetensors_shards_and_an_index(run):
    from safetensors.torch import load_file

    tmp, _, stdout = run
    one = load_file(tmp / "one" / "model.safetensors")
    assert set(one) == {"0.weight", "1.weight", "1.bias"}  # the tied copy is saved once
    assert "2.weight share memory with another weight" in stdout
    index = json.loads((tmp / "shards" / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in (tmp / "shards").iterdir())
    assert files == sorted(["model.safetensors.index.json", *set(index["weight_map"].values())])
    merged = {}
    for name in set(index["weight_map"].values()):
        merged.update(load_file(tmp / "shards" / name))
    assert len(set(index["weight_map"].values())) == 2 and index["metadata"]["total_size"] == 160 + 64 + 16
    assert all(torch.equal(merged[k], one[k]) for k in one) and set(merged) == set(one)
    both = torch.load(tmp / "bin" / "pytorch_model.bin")
    assert torch.equal(both["0.weight"], both["2.weight"]) and torch.equal(both["0.weight"], one["0.weight"])
    assert torch.load(tmp / "extra.pt") == {"step": 7}
