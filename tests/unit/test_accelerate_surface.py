"""Every public name of Accelerate 1.15.0's public modules exists at the same path in hpc (`accelerate.X.name` ->
`hpc.X.name`), so a script runs with only `accelerate` replaced by `hpc` in its imports, and a new gap fails here.

The names are read once from Accelerate's wheel (ast, nothing imported) and kept in accelerate_surface.json;
regenerate with `python scripts/accelerate_surface.py`. The one allowance is BY_DESIGN below: names Accelerate's
files bind only because they import them for their own use (the standard library, torch, other packages, and
modules of platforms hpc does not run), each group with its reason; docs/accelerate-surface.md shows the same table.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SURFACE = json.loads((Path(__file__).with_name("accelerate_surface.json")).read_text())
DOC = ROOT / "docs" / "accelerate-surface.md"

BY_DESIGN = {
    "standard library": (
        "Accelerate's file imports these for its own use (typing's Optional, os, functools, ...): they are the "
        "standard library's, not Accelerate's API; a script imports them from where they live", {
            "accelerate.accelerator": ["Any", "Callable", "MethodType", "OrderedDict", "Union", "annotations",
                                       "contextlib", "contextmanager", "functools", "inspect", "json", "math", "os",
                                       "partial", "re", "shutil", "warnings"],
            "accelerate.big_modeling": ["Optional", "Union", "contextmanager", "logging", "os", "re", "wraps"],
            "accelerate.checkpointing": ["Optional", "Path", "random"],
            "accelerate.data_loader": ["Callable", "Optional", "Union", "importlib", "math", "suppress"],
            "accelerate.hooks": ["Mapping", "Optional", "Union", "functools"],
            "accelerate.inference": ["Any", "MethodType", "Optional", "Union", "math"],
            "accelerate.launchers": ["fields", "os", "sys", "tempfile"],
            "accelerate.logging": ["annotations", "functools", "logging", "os"],
            "accelerate.memory_utils": ["warnings"],
            "accelerate.optimizer": ["inspect"],
            "accelerate.parallelism_config": ["Literal", "Optional", "TYPE_CHECKING", "Union", "dataclass", "os",
                                              "warnings"],
            "accelerate.scheduler": ["warnings"],
            "accelerate.state": ["Any", "Callable", "annotations", "contextmanager", "logging", "os", "partial",
                                 "threading", "warnings", "weakref"],
            "accelerate.tracking": ["Any", "Optional", "Union", "json", "os", "time", "warnings", "wraps"],
        }),
    "torch": (
        "torch's own module and classes as Accelerate's file imports them (torch, nn, DataLoader, Join, ...): a "
        "script imports them from torch", {
            "accelerate.accelerator": ["Join", "LRScheduler", "hooks", "torch"],
            "accelerate.big_modeling": ["nn", "torch"],
            "accelerate.checkpointing": ["GradScaler", "torch"],
            "accelerate.data_loader": ["BatchSampler", "DataLoader", "IterableDataset", "RandomSampler", "torch"],
            "accelerate.hooks": ["nn", "torch"],
            "accelerate.launchers": ["torch"],
            "accelerate.local_sgd": ["torch"],
            "accelerate.optimizer": ["torch"],
            "accelerate.state": ["torch"],
        }),
    "other packages": (
        "other packages' names Accelerate's file imports (numpy as np, packaging's version, yaml, safetensors' "
        "load_model): not Accelerate's API", {
            "accelerate.checkpointing": ["load_model", "np"],
            "accelerate.data_loader": ["version"],
            "accelerate.tracking": ["version", "yaml"],
        }),
    "platform modules": (
        "torch_xla's xm/xmp/xr/xpl and the NPU, MLU, MUSA and SDAA torch extensions: Accelerate binds them only "
        "when that platform's package is installed (else the name does not exist there either); hpc does not run "
        "on those platforms, and its probes (is_torch_xla_available(), is_npu_available(), ...) answer False", {
            "accelerate.accelerator": ["torch_npu", "xm", "xmp"],
            "accelerate.checkpointing": ["xm"],
            "accelerate.data_loader": ["xpl"],
            "accelerate.optimizer": ["xm", "xr"],
            "accelerate.state": ["torch_mlu", "torch_musa", "torch_npu", "torch_sdaa", "xm", "xr"],
        }),
}


def _by_design(module: str) -> set[str]:
    return {name for _, table in BY_DESIGN.values() for name in table.get(module, [])}


def _hpc_path(module: str) -> str:
    return "hpc" + module[len("accelerate"):]


@pytest.mark.parametrize("module", sorted(SURFACE["modules"]))
def test_every_public_name_of_accelerates_module_is_at_the_same_path_in_hpc(module):
    hpc_module = importlib.import_module(_hpc_path(module))
    missing = []
    for name in SURFACE["modules"][module]:
        if name in _by_design(module):
            continue
        try:
            getattr(hpc_module, name)
        except (AttributeError, ImportError) as error:
            missing.append(f"{name} ({error})" if "has no attribute" not in str(error) else name)
    assert not missing, (f"{_hpc_path(module)} lacks {len(missing)} of Accelerate's {module} names: "
                         f"{', '.join(missing)}")


# accelerate.utils.tqdm is the one submodule named as a function of accelerate.utils (tqdm): hpc.utils loads its
# names on first use, and a submodule hpc.utils.tqdm, once imported, would shadow the function there
SHADOWING = {"tqdm"}


@pytest.mark.parametrize("submodule", sorted(set(SURFACE["utils_submodules"]) - SHADOWING))
def test_each_accelerate_utils_submodule_path_gives_the_names_accelerate_utils_takes_from_it(submodule):
    """`from accelerate.utils.memory import find_executable_batch_size`, `from accelerate.utils.other import
    extract_model_from_parallel`, ...: scripts and libraries import by the submodule's path too (11 of these 19
    paths were missing, 71 names of the other 8). Private names (a leading underscore) are Accelerate's own."""
    module = importlib.import_module(f"hpc.utils.{submodule}")
    wanted = [n for n in SURFACE["utils_submodules"][submodule] if not n.startswith("_")]
    missing = [n for n in wanted if not hasattr(module, n)]
    assert not missing, f"hpc.utils.{submodule} lacks {', '.join(missing)}"
    assert {n: getattr(module, n) for n in wanted} == {n: getattr(importlib.import_module("hpc.utils"), n)
                                                       for n in wanted}  # the same objects, re-exported


def test_the_kept_list_is_all_seventeen_modules_and_names_its_regeneration():
    assert SURFACE["accelerate_version"] == "1.15.0"
    assert SURFACE["regenerate"] == "python scripts/accelerate_surface.py"
    assert len(SURFACE["modules"]) == 17 and len(SURFACE["modules"]["accelerate.utils"]) == 264


def test_the_by_design_table_names_only_accelerates_names_and_docs_show_each():
    """A stale entry (a name Accelerate no longer binds) or one the page does not explain fails here."""
    page = DOC.read_text()
    for group, (reason, table) in BY_DESIGN.items():
        for module, names in table.items():
            assert set(names) <= set(SURFACE["modules"][module]), (group, module)
            assert f"`{module}`" in page, module
            for name in names:
                assert f"`{name}`" in page, (group, module, name)


def test_the_reader_takes_top_level_bindings_only():
    """What counts as public: top-level defs, classes, assignments and imports (also under a top-level if/try),
    without a leading underscore; nothing inside a function or class."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from accelerate_surface import public_names
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    source = ("import os\nfrom .x import a as b, _c\nif ok():\n    from .y import d\nelse:\n    e = 1\n"
              "try:\n    import p.q\nexcept ImportError:\n    f = None\n"
              "def g():\n    inner = 1\nclass H:\n    attr = 2\n_private = 3\nT: int = 4\n")
    assert public_names(source) == ["H", "T", "b", "d", "e", "f", "g", "os", "p"]


def test_hpc_utils_tqdm_stays_the_function():
    from hpc.utils import tqdm

    assert callable(tqdm) and not isinstance(tqdm, type(importlib))
