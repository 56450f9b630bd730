"""The README's two commands stay true: CI runs the second verbatim; the first names real things."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (REPO / "README.md").read_text(), re.S)[:2]


def test_ci_runs_the_readme_test_command():
    _, test_command = readme_commands()
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_command in ci


def test_the_main_job_command_names_existing_things():
    main_command, _ = readme_commands()
    assert "--profile local" in main_command
    for path in re.findall(r"scripts/\S+\.py", main_command):
        assert (REPO / path).is_file(), path
