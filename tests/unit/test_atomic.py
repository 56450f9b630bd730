"""hpc.contract.atomic: whole or nothing, private until renamed, never through a link."""

import os
import stat

import pytest

from hpc.contract.atomic import atomic_write, replacing


def test_the_file_holds_all_of_the_new_content_with_the_mode_asked_for(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    atomic_write(target, "new" * 1000)
    assert target.read_text() == "new" * 1000
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    atomic_write(target, b"\x00bytes", mode=0o600)
    assert target.read_bytes() == b"\x00bytes" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_failure_while_writing_leaves_the_old_content_and_no_temp_file(tmp_path):
    target = tmp_path / "record.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        tmp.write_text("half")
        assert stat.S_IMODE(tmp.stat().st_mode) == 0o600  # no one else reads it before it is whole
        raise RuntimeError("disk full")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_a_link_planted_at_the_target_is_replaced_not_written_through(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("theirs")
    target = tmp_path / "timings.json"
    target.symlink_to(elsewhere)
    atomic_write(target, "ours")
    assert not target.is_symlink() and target.read_text() == "ours" and elsewhere.read_text() == "theirs"


def test_append_whole_adds_whole_lines_and_a_new_file_gets_the_mode_asked(tmp_path):
    from hpc.contract.atomic import append_whole

    path = tmp_path / "notes"
    append_whole(path, "a 1\n")
    append_whole(path, "b 2\nc 3\n", mode=0o644)  # the file exists: its mode stays
    assert path.read_text() == "a 1\nb 2\nc 3\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_new_never_replaces_a_file_there_before_or_made_meanwhile(tmp_path):
    target = tmp_path / "job.yaml"
    atomic_write(target, "a: 1\n", new=True)
    assert target.read_text() == "a: 1\n"
    with pytest.raises(FileExistsError):
        atomic_write(target, "a: 2\n", new=True)
    other = tmp_path / "profile.yaml"
    with pytest.raises(FileExistsError), replacing(other, new=True) as tmp:
        assert tmp.suffix == ".yaml" and tmp.name.startswith(".profile.yaml.tmp")  # a loader reads it as YAML
        tmp.write_text("mine\n")
        other.write_text("someone else's\n")  # made while ours was being checked
    assert other.read_text() == "someone else's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml", "profile.yaml"]  # no temp file left
