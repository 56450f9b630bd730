"""Reading DCP (torch.distributed.checkpoint) folders without unpickling arbitrary objects.

DCP's reader unpickles `.metadata` with plain pickle, and its planner loads non-tensor entries (an optimizer's
param_groups) with ``weights_only=False``. Both are replaced here: the metadata is unpickled with only DCP's
own metadata dataclasses and torch's sizes, dtypes and layouts allowed (Python's documented way of restricting
globals), and entries load with ``weights_only=True``. A `.metadata` that names anything else is refused in
one line (safe_load.refused), unless the user opted in to trusting the folder's pickles.
"""

from __future__ import annotations

import io
import pathlib
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as _md
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from hpc.errors import HpcError
from hpc.runtime.checkpoint import safe_load

METADATA = ".metadata"  # DCP's file name for it


def _allowed() -> dict[tuple[str, str], object]:
    from torch.distributed.checkpoint import filesystem

    classes = [_md.Metadata, _md.TensorStorageMetadata, _md.BytesStorageMetadata, _md.ChunkStorageMetadata,
               _md.TensorProperties, _md.MetadataIndex, _md.StorageMeta, _md._MEM_FORMAT_ENCODING,
               filesystem._StorageInfo, torch.Size, pathlib.PosixPath, pathlib.PurePosixPath,
               pathlib.WindowsPath, pathlib.PureWindowsPath]
    allowed = {(c.__module__, c.__qualname__): c for c in classes}
    # pathlib's classes moved to pathlib._local in Python 3.13: a file may name either
    allowed.update({("pathlib", c.__qualname__): c for c in classes if c.__module__.startswith("pathlib")})
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    allowed[("collections", "OrderedDict")] = __import__("collections").OrderedDict
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path, self.allowed = path, _allowed()

    def find_class(self, module: str, name: str):
        if (module, name) in self.allowed:
            return self.allowed[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                         torch.memory_format)):
            return getattr(torch, name)
        raise safe_load.refused(self.path, f"names {module}.{name}, which a DCP metadata file never holds")


def read_metadata(path: Path) -> _md.Metadata:
    """A DCP folder's metadata (its tensors' keys, shapes and where each chunk lies)."""
    path = Path(path) / METADATA
    with open(path, "rb") as f:
        try:
            return _MetadataUnpickler(f, path).load()
        except HpcError:
            if not safe_load.trusted():
                raise
        f.seek(0)
        safe_load.note_trusted(path)
        return pickle.load(f)


class SafeReader(FileSystemReader):
    """DCP's file reader, with the metadata unpickled under the allowlist above."""

    def read_metadata(self, *args, **kwargs) -> _md.Metadata:
        metadata = read_metadata(Path(str(self.path)))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = _md.StorageMeta()
        metadata.storage_meta.load_id = getattr(self, "load_id", None)
        return metadata


def loading(folder: Path, load, planner: SafeBytes) -> None:
    """Run ``load`` (a DCP load through SafeReader and ``planner``) with a refusal said in its own one line:
    the metadata is read here first, and DCP's wrapping of an entry's refusal is unwrapped."""
    read_metadata(folder)
    try:
        load()
    except Exception:
        if planner.refusal is not None:
            raise planner.refusal from None
        raise


class SafeBytes:
    """A load planner's non-tensor entries loaded with weights_only=True (DefaultLoadPlanner's own do not)."""

    refusal: Exception | None = None

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        key = read_item.dest_index.fqn
        try:
            obj = safe_load.load(value, name=f"the DCP entry {key}")
        except Exception as e:
            self.refusal = e  # DCP re-raises what a planner raises inside an error of its own, per rank
            raise
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[key], obj)
        else:
            self.state_dict[key] = obj


class SafeLoadPlanner(SafeBytes, DefaultLoadPlanner):
    pass
