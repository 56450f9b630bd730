"""The job's memory headroom the fast tier's saves must fit (tmpfs pages are charged to the job's cgroup and cannot
be reclaimed): read off fake cgroup trees, v1 and v2, the tightest limit on the way up; and a save that would not
fit is not written, in one line, as a full tier is."""

from pathlib import Path

import pytest

from hpc.runtime.checkpoint.tiers import memory_headroom
from tests.unit.test_fast_tier import _meta, _tier

GIB = 1 << 30


def _write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def test_cgroup_v2_the_tightest_limit_on_the_way_up_less_anonymous_and_tmpfs_memory(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    _write(tmp_path / "job_7", memory_max=f"{8 * GIB}\n", memory_stat=f"anon {GIB}\nfile {5 * GIB}\nshmem {GIB}\n")
    _write(tmp_path / "job_7" / "step_0", memory_max="max\n", memory_stat=f"anon {GIB}\nshmem {GIB}\n")
    # the job's 8 GiB, less 2 GiB that cannot be reclaimed; the page cache (file) can be
    assert memory_headroom.headroom("0::/job_7/step_0\n", tmp_path) == 6 * GIB
    assert memory_headroom.headroom("0::/elsewhere\n", tmp_path) is None  # the mount's root: no limit there


def test_cgroup_v1_reads_the_memory_controllers_hierarchy(tmp_path):
    mount = tmp_path / "memory"
    _write(mount, memory_limit_in_bytes="9223372036854771712\n", memory_stat="total_rss 1\n")
    _write(mount / "slurm" / "uid_0" / "job_7", memory_limit_in_bytes=f"{4 * GIB}\n",
           memory_stat=f"rss 5\ntotal_rss {GIB}\ntotal_shmem {GIB // 2}\ntotal_cache {2 * GIB}\n")
    _write(mount / "slurm" / "uid_0" / "job_7" / "step_0", memory_limit_in_bytes=f"{3 * GIB}\n",
           memory_stat=f"total_rss {GIB}\ntotal_shmem 0\n")
    text = "5:cpu,cpuacct:/slurm/uid_0/job_7/step_0\n4:memory:/slurm/uid_0/job_7/step_0\n0::/\n"
    assert memory_headroom.headroom(text, tmp_path) == 2 * GIB  # the step's 3 GiB less 1 GiB beats the job's 2.5
    assert memory_headroom.headroom("4:memory:/\n", tmp_path) is None
    assert memory_headroom.headroom("no cgroup lines\n", tmp_path) is None


def test_a_save_beyond_the_jobs_memory_headroom_is_not_written_and_says_why(tmp_path, monkeypatch):
    tier = _tier(tmp_path)
    monkeypatch.setattr(memory_headroom, "headroom", lambda: 100 << 20)  # 100 MiB left of the job's limit
    tier.save(1, _meta(1))
    tier.wait()
    assert tier.fallback_due and "the job's memory limit leaves 100.0 MiB" in tier.fallback_due
    assert not tier.node.store("own", 0).step_dir(1).exists()


@pytest.mark.parametrize("text", ["", "garbage", "4:memory"])
def test_unreadable_cgroup_lines_mean_no_limit_known(tmp_path, text):
    assert memory_headroom.headroom(text, tmp_path) is None
