"""Accelerator methods of Accelerate's API on 2 real ranks: save_model (safetensors, shards, an index), save,
gather_for_metrics of objects, set_trigger/check_trigger, the on_* decorators, split_between_processes."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

WORKER = textwrap.dedent("""
    import json, sys
    import torch
    from hpc import Accelerator
    from hpc.utils import DistributedType

    acc = Accelerator()
    out = {"type_is_enum": acc.distributed_type == DistributedType.MULTI_CPU, "last": acc.is_last_process}
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
    if acc.is_main_process:
        json.dump(out, open(sys.argv[1] + "/out.json", "w"))
""")


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


def test_a_second_save_with_fewer_shards_leaves_none_of_the_first(tmp_path):
    from hpc.runtime import model_files

    state = {f"w{i}": torch.full((25,), float(i)) for i in range(4)}  # 100 bytes each
    assert len(model_files.write(state, tmp_path, max_shard_size=150)) == 5  # four shards and the index
    assert model_files.write(state, tmp_path, max_shard_size="1KB") == ["model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    with pytest.raises(Exception, match="max_shard_size='lots' is not a size"):
        model_files.write(state, tmp_path, max_shard_size="lots")
