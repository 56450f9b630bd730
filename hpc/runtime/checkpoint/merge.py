"""A checkpoint's model weights as one file: from whole (DDP), DCP shards (FSDP) or ZeRO partitions.

Read without unpickling (safe_load.py, dcp_safe.py): a checkpoint folder may be writable by others. DeepSpeed's
reader unpickles its files whatever it is asked, so a DeepSpeed checkpoint is merged only when the user says
they trust the folder (HPC_TRUST_CHECKPOINT_PICKLES=1, which ``hpc merge-weights --trust-pickles`` sets).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from hpc.errors import HpcError
from hpc.runtime.checkpoint import manifest, private_temp, safe_load
from hpc.runtime.checkpoint.store import CheckpointStore

TRUST_FLAG = "--trust-pickles"


def resolve(path: Path) -> Path:
    """A step folder, or the newest good committed one under a checkpoints folder (or a project folder): one
    that is damaged is passed over with a one-line note."""
    path = Path(path)
    if manifest.read(path) is not None:
        return path
    for root in (path, path / "checkpoints"):
        store = CheckpointStore(root)
        if not store.committed():
            continue
        good = store.newest_good(skipped=lambda entry, problem: print(
            f"hpc: skipping damaged checkpoint {entry.path.name}: {problem}", file=sys.stderr, flush=True))
        if good is None:
            raise HpcError(f"{root}: every committed checkpoint is damaged", fix="see the notes above")
        return good.path
    raise HpcError(f"{path}: no committed checkpoint (no {manifest.NAME})",
                   fix="name a step-N folder that save_state committed")


def model_weights(folder: Path, index: int = 0) -> dict[str, torch.Tensor]:
    problem = manifest.check(folder, manifest.read(folder))
    if problem:
        raise HpcError(f"cannot merge: {problem}", fix="use an earlier step folder")
    fmt = manifest.read(folder).get("format")
    if fmt == "full":
        return safe_load.load(folder / f"model_{index}.pt", map_location="cpu")
    if fmt == "dcp":
        from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        from hpc.runtime.checkpoint import dcp_safe

        class Planner(dcp_safe.SafeBytes, _EmptyStateDictLoadPlanner):
            pass

        state: dict = {}
        planner = Planner(keys={f"model_{index}"})
        # no process group: the planner reads every shard and stitches each tensor whole
        dcp_safe.loading(folder / "dcp", lambda: _load_state_dict(
            state, storage_reader=dcp_safe.SafeReader(str(folder / "dcp")), planner=planner, no_dist=True), planner)
        return state[f"model_{index}"]
    if fmt == "deepspeed":
        if not safe_load.trusted():
            raise safe_load.refused(folder, "a DeepSpeed checkpoint, whose reader unpickles its files",
                                    fix=f"pass {TRUST_FLAG} only if you trust everyone who can write the folder")
        from hpc.runtime.availability import import_deepspeed

        import_deepspeed("cpu")
        from deepspeed.utils.zero_to_fp32 import (
            get_fp32_state_dict_from_zero_checkpoint,
        )

        return get_fp32_state_dict_from_zero_checkpoint(str(folder / "deepspeed"), tag="state")
    raise HpcError(f"{folder}: unknown checkpoint format {fmt!r}", fix="merge it with the hpc version that wrote it")


def write(weights: dict[str, torch.Tensor], out: Path, fmt: str) -> None:
    """Through a private temporary folder: a merge cut short leaves no file that looks whole, and no name
    beside ``out`` that another user could have planted a link at."""
    # DTensor shards are already whole here; tied weights are copied apart (safetensors refuses shared storage)
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()}
    with private_temp.writing(out) as tmp:
        if fmt == "safetensors":
            from safetensors.torch import save_file

            save_file(plain, str(tmp), metadata={"format": "pt"})
        else:
            torch.save(plain, tmp)
