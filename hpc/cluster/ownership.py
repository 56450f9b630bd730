"""Whether another user could change a path: the check every folder and file hpc trusts goes through (the SSH
socket folder, job roots, job records, ./job_templates and ./cluster_configs)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def _mode(st: os.stat_result) -> str:
    return f"mode {stat.filemode(st.st_mode)}"


def insecure(path: str | Path, *, private: bool = False, sticky_ok: bool = False) -> str | None:
    """Why another user could change what ``path`` holds, or None when no one else can (sshd's StrictModes):
    it and every folder above it belong to this user or root and are writable by no one else. A sticky folder
    above it (/tmp) may be writable by all: no one else can rename or remove what is ours in it; ``path``
    itself may be one only with ``sticky_ok`` (a folder we only make a folder of our own in).

    ``private``: ``path`` is a real folder (not a symlink) of this user's that no one else may even read.
    """
    me = os.geteuid()
    path = Path(path)
    try:
        top = os.lstat(path)
    except OSError as e:
        return f"cannot be checked ({e.strerror})"
    if private:
        if stat.S_ISLNK(top.st_mode):
            return "is a symlink, not a folder of its own"
        if not stat.S_ISDIR(top.st_mode):
            return "is not a folder"
        if top.st_uid != me:
            return f"belongs to uid {top.st_uid}, not to you (uid {me})"
        if top.st_mode & 0o077:
            return f"is open to group or others ({_mode(top)}; it must be 0700)"
    real = Path(os.path.realpath(path))
    # the folder holding a symlink could swap it: its chain is checked as well as the target's
    holder = Path(os.path.realpath(path.parent))
    chain = dict.fromkeys([real, *real.parents, holder, *holder.parents])
    for folder in chain:
        try:
            st = os.stat(folder)
        except OSError as e:
            return f"lies in {folder}, which cannot be checked ({e.strerror})"
        if folder != real:
            which = f"lies in {folder}, which "
        else:
            which = "" if real == Path(os.path.abspath(path)) else f"leads to {real}, which "
        if st.st_uid not in (me, 0):
            return f"{which}belongs to uid {st.st_uid}, not to you (uid {me}) or root"
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and (folder != real or sticky_ok)
        if st.st_mode & 0o022 and not sticky:
            return f"{which}is writable by group or others ({_mode(st)})"
    return None
