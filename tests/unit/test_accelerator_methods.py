"""save_model's files in this process: a second save leaves none of the first's shards (the Accelerator methods on
2 real ranks: tests/test_accelerator_methods.py)."""

import pytest
import torch


def test_a_second_save_with_fewer_shards_leaves_none_of_the_first(tmp_path):
    from hpc.runtime.checkpoint import model_files

    state = {f"w{i}": torch.full((25,), float(i)) for i in range(4)}  # 100 bytes each
    assert len(model_files.write(state, tmp_path, max_shard_size=150)) == 5  # four shards and the index
    assert model_files.write(state, tmp_path, max_shard_size="1KB") == ["model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    with pytest.raises(Exception, match="max_shard_size='lots' is not a size"):
        model_files.write(state, tmp_path, max_shard_size="lots")
