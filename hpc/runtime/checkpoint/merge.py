"""A checkpoint's model weights as one file: from whole (DDP), DCP shards (FSDP) or ZeRO partitions."""

from __future__ import annotations

from pathlib import Path

import torch

from hpc.errors import HpcError
from hpc.runtime.checkpoint import manifest
from hpc.runtime.checkpoint.store import CheckpointStore


def resolve(path: Path) -> Path:
    """A step folder, or the newest committed one under a checkpoints folder (or a project folder)."""
    path = Path(path)
    if manifest.read(path) is not None:
        return path
    for root in (path, path / "checkpoints"):
        committed = CheckpointStore(root).committed()
        if committed:
            return committed[0].path
    raise HpcError(f"{path}: no committed checkpoint (no {manifest.NAME})",
                   fix="name a step-N folder that save_state committed")


def model_weights(folder: Path, index: int = 0) -> dict[str, torch.Tensor]:
    data = manifest.read(folder)
    problem = manifest.verify(folder, data["files"])
    if problem:
        raise HpcError(f"cannot merge: {problem}", fix="use an earlier step folder")
    fmt = data.get("format")
    if fmt == "full":
        return torch.load(folder / f"model_{index}.pt", map_location="cpu", weights_only=True)
    if fmt == "dcp":
        from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
        from torch.distributed.checkpoint import FileSystemReader

        state: dict = {}
        # no process group: the planner reads every shard and stitches each tensor whole
        _load_state_dict(state, storage_reader=FileSystemReader(str(folder / "dcp")),
                         planner=_EmptyStateDictLoadPlanner(keys={f"model_{index}"}), no_dist=True)
        return state[f"model_{index}"]
    if fmt == "deepspeed":
        from hpc.runtime.strategies.deepspeed import import_deepspeed

        import_deepspeed("cpu")
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(folder / "deepspeed"), tag="state")
    raise HpcError(f"{folder}: unknown checkpoint format {fmt!r}", fix="merge it with the hpc version that wrote it")


def write(weights: dict[str, torch.Tensor], out: Path, fmt: str) -> None:
    """Through a temporary name: a merge cut short leaves no file that looks whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    # DTensor shards are already whole here; tied weights are copied apart (safetensors refuses shared storage)
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(plain, str(tmp), metadata={"format": "pt"})
    else:
        torch.save(plain, tmp)
    tmp.replace(out)
