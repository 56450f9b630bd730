"""Copy the project's code into the job folder at submit, so later edits never change a queued job.

What looks like a credential (``.env``, ``.netrc``, ``id_rsa``, ``*.pem``, ``.aws/credentials``, ``.secrets.yaml``,
a private key in any file; ``credential_files.py`` says which) is never copied, in a git work tree or a walked
folder, even when git tracks it: the job folder is read on the cluster, by its admins and backups. A symlink is
copied as the file it points to when that file is in the project, and left out when it leads out of it (a link
to ~/.ssh/id_rsa); a link to a folder is left out, as before. What was left out is in the result's ``left_out``.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from pathlib import Path

from hpc.cluster.credential_files import holds_private_key, is_credential
from hpc.errors import HpcError

DEFAULT_INCLUDE = ("*.py", "*.yaml", "*.yml", "*.json", "*.toml", "*.txt", "*.sh", "*.cfg", "*.ini")
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache", ".pytest_cache", ".hypothesis"}
MAX_BYTES = 256 * 1024 * 1024
LEFT_OUT_SHOWN = 20  # names kept in the record; the count says how many in all


def _git_files(cwd: Path) -> tuple[Path, list[str], dict] | None:
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=False, cwd=cwd, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if top.returncode != 0:
        return None
    root = Path(top.stdout.strip())
    # tracked files and new ones git does not ignore: a script not yet `git add`ed still travels
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           check=False, cwd=root, capture_output=True, timeout=60).stdout.decode().split("\0")
    head = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=root, capture_output=True, text=True,
                          timeout=10)
    dirty = subprocess.run(["git", "status", "--porcelain"], check=False, cwd=root, capture_output=True, text=True,
                           timeout=30)
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
    real_root = root.resolve()
    total, copied, left_out = 0, 0, []
    for rel in files:
        src = root / rel
        if not src.is_file() or any(d == src or d in src.parents for d in excluded):
            continue  # deleted but still tracked, a link to a folder, or the job folders themselves
        real = src.resolve()
        if not real.is_relative_to(real_root) or is_credential(rel) \
                or is_credential(real.relative_to(real_root).as_posix()) or holds_private_key(real):
            left_out.append(rel)
            continue
        total += real.stat().st_size
        if total > MAX_BYTES:
            raise HpcError(f"the code snapshot exceeds {MAX_BYTES >> 20} MiB (at {rel})",
                           fix="keep data out of the project (or .gitignore it), or submit with --no-snapshot")
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(real, target)  # the file itself: a link inside the project becomes a copy
        copied += 1
    info.update({"root": str(root), "files": copied, "bytes": total})
    if left_out:
        info.update({"left_out": left_out[:LEFT_OUT_SHOWN], "left_out_count": len(left_out)})
    return dest / cwd.relative_to(root), info
