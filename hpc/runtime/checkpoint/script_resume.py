"""The checkpoints of a script that resumes itself (the job key resume_args), and the one a requeued attempt gets.

Rank 0 notes each folder the script passes to save_state, and the one hpc saves for it at the warning signal,
in tasks/<task>.saves (a JSON line each). The next attempt's batch script runs
`python -m hpc.runtime.checkpoint.script_resume JOB_DIR TASK`, which prints the newest noted folder whose manifest
verifies (damaged, uncommitted and deleted ones are skipped with a line on stderr) and exits 1 when there is none: the
script then starts from the beginning. Torch-free: it runs in the batch shell before any rank starts.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from hpc.contract.atomic import append_whole
from hpc.contract.layout import JobFolder, TaskFile
from hpc.runtime.checkpoint import manifest


def _saves_file(job_dir: str | os.PathLike, task: str) -> Path:
    return Path(JobFolder(job_dir).task(task, TaskFile.SAVES))


def note(job_dir: str | os.PathLike, task: str, folder: str | os.PathLike, step: int) -> None:
    """Rank 0: the script (or hpc for it) saves its state into ``folder`` at optimizer step ``step``. Called before
    the save is written: its step counts as the job's progress only once committed, noted then by the save itself
    (TrainingCheckpoints.save, progress_guard), never here."""
    line = json.dumps({"path": str(Path(folder).absolute()), "step": int(step)}) + "\n"
    append_whole(_saves_file(job_dir, task), line)


def naming(folder: str | os.PathLike, step: int) -> str | None:
    """The script's naming of step checkpoints, read off a folder it saved at ``step``: out/step_12 at step 12 is
    out/step_{step}. None where the step is not in the name (epoch_1, latest): saving there mid-epoch would make
    the script's resume arithmetic land elsewhere."""
    path = Path(folder)
    found = list(re.finditer(rf"(?<!\d){int(step)}(?!\d)", path.name))
    if not found:
        return None
    m = found[-1]
    return str(path.with_name(path.name[:m.start()] + "{step}" + path.name[m.end():]))


def newest(job_dir: str | os.PathLike, task: str) -> Path | None:
    """The newest noted checkpoint that verifies, or None."""
    try:
        lines = _saves_file(job_dir, task).read_text().splitlines()
    except OSError:
        return None
    entries = []
    for order, line in enumerate(lines):
        try:
            entry = json.loads(line)
            entries.append((int(entry["step"]), order, Path(entry["path"])))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash
    seen: set[Path] = set()
    for _, _, path in sorted(entries, key=lambda e: (e[0], e[1]), reverse=True):
        if path in seen:
            continue
        seen.add(path)
        data = manifest.read(path)
        problem = (f"{path}: not a committed checkpoint (missing, or its save never finished)" if data is None
                   else manifest.check(path, data))  # a malformed manifest (a format hpc never writes) is damage
        if problem is None:
            return path
        print(f"hpc: not resuming from {path.name}: {problem}", file=sys.stderr)
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m hpc.runtime.checkpoint.script_resume JOB_DIR TASK", file=sys.stderr)
        return 2
    found = newest(argv[0], argv[1])
    if found is None:
        print("hpc: no checkpoint of the script's verifies: it starts from the beginning", file=sys.stderr)
        return 1
    print(found)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
