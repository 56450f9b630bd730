"""preemption.lead_time against what the job measured: the warning at the next submit (the warning in the job's
log, from a real training run: tests/test_lead_time.py)."""

import time

from hpc.cluster import records as jobs
from hpc.contract import timings as lead_time
from tests.jobhelpers import hpc


def test_shortfall_names_the_step_the_save_and_a_lead_time_that_fits():
    assert lead_time.shortfall(lead_time.Timings(step_s=4.0, save_s=20.0), 30) is None
    problem = lead_time.shortfall(lead_time.Timings(step_s=12.0, save_s=25.3), 30)
    assert "lead_time is 30 s" in problem and "12.0 s" in problem and "25.3 s" in problem
    assert "set preemption.lead_time to 60 or more" in problem  # 1.5 x 37.3 s, rounded up to tens


def _earlier_job(tmp_path, monkeypatch, timings):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    folder = tmp_path / "old-job"
    folder.mkdir()
    jobs.save(jobs.JobRecord(job_id="41", scheduler="slurm", profile="slurm-local", name="train", job_dir=str(folder),
                             submitted_at=time.time(), argv=[], workdir=str(tmp_path), script="job.sbatch"))
    lead_time.write(folder, timings)


def test_the_next_submit_warns_with_what_the_last_job_of_that_name_measured(tmp_path, monkeypatch):
    _earlier_job(tmp_path, monkeypatch, lead_time.Timings(step_s=9.0, save_s=40.0))
    (tmp_path / "train.py").write_text("")
    proc = hpc(tmp_path, "submit", "--dry-run", "-p", "slurm-local", "-J", "train", "train.py", check=True)
    assert "warning: job 41 measured it: preemption.lead_time is 30 s" in proc.stderr, proc.stderr
    other = hpc(tmp_path, "submit", "--dry-run", "-p", "slurm-local", "-J", "other", "train.py", check=True)
    assert "warning" not in other.stderr


def test_no_warning_when_the_lead_time_fits(tmp_path, monkeypatch):
    _earlier_job(tmp_path, monkeypatch, lead_time.Timings(step_s=2.0, save_s=5.0))
    (tmp_path / "train.py").write_text("")
    proc = hpc(tmp_path, "submit", "--dry-run", "-p", "slurm-local", "-J", "train", "train.py", check=True)
    assert "warning" not in proc.stderr, proc.stderr
