"""Model weights as HuggingFace tools read them: `model.safetensors`, or shards plus an index when large.

What `save_model` writes: one file up to ``max_shard_size``, else ``model-00001-of-0000N.safetensors`` and
``model.safetensors.index.json`` (``pytorch_model*.bin`` without safe serialization). Every file is written
in a private temporary folder (private_temp.py: no name another user could plant a link at) and renamed into
place, the index last, and shards of an earlier save that the new one does not use are removed, so a folder
never mixes two saves' shards.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from hpc.errors import HpcError
from hpc.runtime.checkpoint import private_temp

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """'10GB' (powers of 10, as transformers counts), '5GiB', or a number of bytes."""
    if isinstance(size, int) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", str(size).upper())
    if not match:
        raise HpcError(f"max_shard_size={size!r} is not a size", fix="write e.g. '10GB', '500MB' or a number of bytes")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _untie(state: dict) -> tuple[dict, list[str]]:
    """safetensors refuses tensors sharing memory (tied embeddings): keep the first name of each."""
    seen: dict[tuple, str] = {}
    kept, dropped = {}, []
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape)) \
            if tensor.device.type != "meta" else (id(tensor),)
        if key in seen:
            dropped.append(name)
            continue
        seen[key] = name
        kept[name] = tensor.contiguous()
    return kept, dropped


def _shards(state: dict, limit: int) -> list[dict]:
    shards: list[dict] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:  # a tensor larger than the limit gets a shard of its own
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def write(state: dict, folder: str | os.PathLike, max_shard_size: int | str = "10GB",
          safe_serialization: bool = True) -> list[str]:
    """Write ``state`` (name -> tensor) into ``folder``; the names of the files written. Main process only."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    limit = parse_size(max_shard_size)
    dropped: list[str] = []
    if safe_serialization:  # before the copy to the CPU: tied weights share memory only where they live
        state, dropped = _untie(state)
    state = {k: v.detach().cpu() for k, v in state.items()}
    stem, suffix = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")
    shards = _shards(state, limit)
    names = [f"{stem}{suffix}"] if len(shards) == 1 else [
        f"{stem}-{i + 1:05d}-of-{len(shards):05d}{suffix}" for i in range(len(shards))]
    with private_temp.folder(folder, stem) as private:
        for name, shard in zip(names, shards):
            if safe_serialization:
                from safetensors.torch import save_file

                save_file(shard, str(private / name), metadata={"format": "pt"})
            else:
                torch.save(shard, private / name)
        # the earlier save stops being loadable before its files are replaced one by one: a crash in between
        # leaves no index and no single file to take a mix of two saves for a model
        index = folder / f"{stem}{suffix}.index.json"
        for old in (index, folder / f"{stem}{suffix}"):
            if old.exists():
                old.unlink()
        for name in names:
            os.replace(private / name, folder / name)
        if len(shards) > 1:
            weight_map = {key: name for name, shard in zip(names, shards) for key in shard}
            total = sum(t.numel() * t.element_size() for t in state.values())
            (private / index.name).write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
            os.replace(private / index.name, index)
            names.append(index.name)
    stale = re.compile(rf"^{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?{re.escape(suffix)}$")
    for old in folder.iterdir():
        if stale.match(old.name) and old.name not in names:
            old.unlink()
    if dropped:
        print(f"hpc: save_model: {', '.join(dropped)} share memory with another weight (tied); saved once",
              flush=True)
    return names


def save_object(obj, f: str | os.PathLike, safe_serialization: bool = False) -> None:
    """Accelerator.save: ``obj`` written whole, torch.save or safetensors (a dict of tensors), then renamed into
    place (private_temp.writing)."""
    with private_temp.writing(Path(f)) as tmp:
        if safe_serialization:
            from safetensors.torch import save_file  # safetensors is imported only by the saves that use it

            save_file({k: v.detach().cpu().contiguous() for k, v in obj.items()}, str(tmp), metadata={"format": "pt"})
        else:
            torch.save(obj, tmp)
