"""Copy the project's code into the job folder at submit, so later edits never change a queued job."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from pathlib import Path

from hpc.errors import HpcError

DEFAULT_INCLUDE = ("*.py", "*.yaml", "*.yml", "*.json", "*.toml", "*.txt", "*.sh", "*.cfg", "*.ini")
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache", ".pytest_cache", ".hypothesis"}
MAX_BYTES = 256 * 1024 * 1024


def _git_files(cwd: Path) -> tuple[Path, list[str], dict] | None:
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if top.returncode != 0:
        return None
    root = Path(top.stdout.strip())
    # tracked files and new ones git does not ignore: a script not yet `git add`ed still travels
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=root, capture_output=True, timeout=60).stdout.decode().split("\0")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=30)
    info = {"source": "git", "commit": head.stdout.strip() or None, "dirty": bool(dirty.stdout.strip())}
    return root, [f for f in files if f], info


def _walk_files(root: Path, include: list[str], exclude: list[str]) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                             and not any(fnmatch.fnmatch(d, pat) for pat in exclude))
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if any(fnmatch.fnmatch(name, pat) for pat in include) and \
                    not any(fnmatch.fnmatch(name, pat) or fnmatch.fnmatch(rel, pat) for pat in exclude):
                out.append(rel)
    return sorted(out)


def take(cwd: Path, dest: Path, exclude_dirs: list[Path], include: list[str] | None = None,
         exclude: list[str] | None = None) -> tuple[Path, dict]:
    """Copy the code under ``cwd``'s project into ``dest``; returns (the matching workdir, what was taken).

    In a git work tree: tracked files plus new ones git does not ignore. Elsewhere: files matching
    ``include`` (default DEFAULT_INCLUDE) outside ``exclude`` patterns and the usual tool folders.
    """
    cwd = cwd.resolve()
    found = _git_files(cwd)
    if found:
        root, files, info = found
    else:
        include = list(include or DEFAULT_INCLUDE)
        exclude = [*SKIP_DIRS, *(d.name for d in exclude_dirs), *(exclude or [])]
        root, info = cwd, {"source": "walk", "include": include, "exclude": exclude}
        files = _walk_files(root, include, exclude)
    excluded = [d.resolve() for d in exclude_dirs]
    total, copied = 0, 0
    for rel in files:
        src = root / rel
        if not src.is_file() or any(d == src or d in src.parents for d in excluded):
            continue  # deleted but still tracked, or the job folders themselves
        total += src.stat().st_size
        if total > MAX_BYTES:
            raise HpcError(f"the code snapshot exceeds {MAX_BYTES >> 20} MiB (at {rel})",
                           fix="keep data out of the project (or .gitignore it), or submit with --no-snapshot")
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        copied += 1
    info.update({"root": str(root), "files": copied, "bytes": total})
    return dest / cwd.relative_to(root), info
