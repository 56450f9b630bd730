#!/usr/bin/env python3
"""Accelerate 1.15.0's public names, per public module, read from its wheel: the list tests/unit/test_surface.py
holds hpc's modules to.

A public name is one the module's file binds at its top level (a def, class, assignment or import, also inside a
top-level if/try) without a leading underscore: what `from accelerate.X import name` can reach. The wheel is only
read with `ast`: Accelerate is never installed or imported.

    python scripts/accelerate_surface.py                # downloads the wheel once (pip download), writes the list
    python scripts/accelerate_surface.py --wheel accelerate-1.15.0-py3-none-any.whl --check   # compare only
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accelerate_conformance import ACCELERATE_VERSION, find_wheel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "tests" / "unit" / "accelerate_surface.json"
# the public modules of the issue (42), then the Python-facing command and test helper modules
MODULES = ["accelerate", "accelerate.accelerator", "accelerate.big_modeling", "accelerate.checkpointing",
           "accelerate.data_loader", "accelerate.hooks", "accelerate.inference", "accelerate.launchers",
           "accelerate.local_sgd", "accelerate.logging", "accelerate.memory_utils", "accelerate.optimizer",
           "accelerate.parallelism_config", "accelerate.scheduler", "accelerate.state", "accelerate.tracking",
           "accelerate.utils"]


def module_file(module: str) -> str:
    path = module.replace(".", "/")
    return f"{path}/__init__.py" if module in ("accelerate", "accelerate.utils") else f"{path}.py"


def _bound(statements: list[ast.stmt], names: set[str]) -> None:
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names if alias.name != "*")
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(leaf.id for target in targets for leaf in ast.walk(target) if isinstance(leaf, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            # `if is_x_available(): from .x import ...` binds at the top level too
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                          *[handler.body for handler in getattr(node, "handlers", [])]):
                _bound(block, names)


def public_names(source: str) -> list[str]:
    names: set[str] = set()
    _bound(ast.parse(source).body, names)
    return sorted(name for name in names if not name.startswith("_"))


def surface(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        return {module: public_names(archive.read(module_file(module)).decode()) for module in MODULES}


def utils_submodules(wheel: Path) -> dict[str, list[str]]:
    """For each module under accelerate/utils/: the names accelerate.utils takes from it (``from .X import ...``,
    also inside a top-level if/try), which scripts also import by the submodule's path
    (``from accelerate.utils.memory import find_executable_batch_size``)."""
    with zipfile.ZipFile(wheel) as archive:
        tree = ast.parse(archive.read("accelerate/utils/__init__.py").decode())
    found: dict[str, set[str]] = {}

    def walk(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                found.setdefault(node.module, set()).update(a.asname or a.name for a in node.names)
            for block in ("body", "orelse", "finalbody"):
                if isinstance(node, (ast.If, ast.Try)):
                    walk(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                walk(handler.body)

    walk(tree.body)
    return {module: sorted(names) for module, names in sorted(found.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", help=f"accelerate-{ACCELERATE_VERSION} wheel (default: pip download, cached)")
    parser.add_argument("--check", action="store_true", help="say whether the kept list matches; write nothing")
    args = parser.parse_args(argv)
    data = {"accelerate_version": ACCELERATE_VERSION,
            "regenerate": "python scripts/accelerate_surface.py",
            "modules": surface(find_wheel(args.wheel)),
            "utils_submodules": utils_submodules(find_wheel(args.wheel))}
    text = json.dumps(data, indent=1) + "\n"
    if args.check:
        same = OUTPUT.exists() and OUTPUT.read_text() == text
        print("the kept list matches the wheel" if same else f"{OUTPUT} differs from the wheel: regenerate it")
        return 0 if same else 1
    OUTPUT.write_text(text)
    for module, names in data["modules"].items():
        print(f"{module:32} {len(names):4}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
