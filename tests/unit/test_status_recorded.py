"""What `hpc status` and `hpc list` decide, against recorded squeue/sacct output: squeue, then accounting, then
the job's own record, then the cancel marker, else UNKNOWN (never COMPLETED); and how few SLURM calls it takes.
(The same backend runs against the real on-machine cluster in test_slurm_jobs.py.)"""

import datetime

import pytest

from hpc.cluster import status
from hpc.cluster.backends.slurm import SlurmBackend
from hpc.cluster.records import JobRecord
from hpc.contract import layout
from hpc.slurm.commands import EPOCH, Slurm
from tests.unit.test_slurm_recorded import Recorded

SUBMITTED = datetime.datetime.fromisoformat("2026-11-22T16:00:00").timestamp()
CONFIG = {"dbd": "AccountingStorageType = accounting_storage/slurmdbd\n",
          "jobcomp": "AccountingStorageType = accounting_storage/none\nJobCompType = jobcomp/filetxt\n"}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the remembered accounting source
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))


def record(tmp_path, job_id, array=None, exits=None, jobids=None, cancelled=False) -> JobRecord:
    folder = tmp_path / f"job-{job_id}"
    (folder / layout.TASKS).mkdir(parents=True)
    rec = JobRecord(job_id=job_id, scheduler="slurm", profile="p", name="train", job_dir=str(folder),
                    submitted_at=SUBMITTED, argv=[], workdir=str(tmp_path), script="job.sbatch", array=array)
    names = layout.JobFolder(folder)
    for task, code in (exits or {}).items():
        (folder / names.task(task, layout.TaskFile.EXIT)).write_text(f"{code}\n")
    for task, raw in (jobids or {}).items():
        (folder / names.task(task, layout.TaskFile.JOBID)).write_text(f"{raw} 0\n")
    if cancelled:
        rec.mark(layout.CANCELLED)
    return rec


def backend(squeue="", sacct="", source="dbd"):
    return SlurmBackend(Slurm(Recorded([(["squeue"], (0, squeue, "")), ([*EPOCH, "sacct"], (0, sacct, "")),
                                        (["scontrol", "show", "config"], (0, CONFIG[source], ""))])))


def calls(b) -> list[str]:
    """The SLURM commands run, by name (sacct runs under env, for epoch times)."""
    return [c[2] if c[0] == "env" else c[0] for c in b.slurm.run.calls]


def states(b, *records):
    got = b.states(list(records))
    return [{t: (s.state, s.exit_code) for t, s in got[r.job_dir].items()} for r in records]


def test_the_decision_table_for_plain_jobs(tmp_path):
    live = record(tmp_path, "10")
    accounted = record(tmp_path, "11", exits={"0": 3})
    signalled = record(tmp_path, "12", exits={"0": 137})  # SLURM says 0:0 for a signal; the script knew better
    stale = record(tmp_path, "13", exits={"0": 0})  # accounting only knows an older job 13 (a reset cluster)
    own_only = record(tmp_path, "14", exits={"0": 2})
    cancelled = record(tmp_path, "15", cancelled=True)
    nothing = record(tmp_path, "16")
    b = backend(squeue="10|PENDING|10|Priority\n",
                sacct=("11|11|TIMEOUT|0:15|2026-11-22T16:00:05\n12|12|FAILED|0:0|2026-11-22T16:00:05\n"
                       "13|13|FAILED|1:0|2020-01-01T00:00:00\n"))
    assert states(b, live, accounted, signalled, stale, own_only, cancelled, nothing) == [
        {"0": ("PENDING", None)}, {"0": ("TIMEOUT", 0)}, {"0": ("FAILED", 137)}, {"0": ("COMPLETED", 0)},
        {"0": ("FAILED", 2)}, {"0": ("CANCELLED", None)}, {"0": ("UNKNOWN", None)}]
    assert b.states([live])[live.job_dir]["0"].reason == "Priority"


def test_an_array_from_squeue_slurmdbd_and_the_jobs_own_record_and_its_summary(tmp_path):
    job = record(tmp_path, "30", array=list(range(6)), exits={"4": 1})
    b = backend(squeue="30_0|RUNNING|31|None\n30_5|PENDING|30|Resources\n",
                sacct="30_1|32|COMPLETED|0:0|2026-11-22T16:00:05\n30_2|33|FAILED|0:0|2026-11-22T16:00:06\n"
                      "30_3|34|CANCELLED by 0|0:15|2026-11-22T16:00:07\n")
    tasks = b.states([job])[job.job_dir]
    assert {t: s.state for t, s in tasks.items()} == {"0": "RUNNING", "1": "COMPLETED", "2": "FAILED",
                                                     "3": "CANCELLED", "4": "FAILED", "5": "PENDING"}
    sacct = next(c for c in b.slurm.run.calls if "sacct" in c)
    assert sacct[sacct.index("-j") + 1] == "30"  # slurmdbd lists every task under the array's id
    assert status.summarize(tasks) == ("RUNNING", 1, {"RUNNING": 1, "COMPLETED": 1, "FAILED": 2, "CANCELLED": 1,
                                                      "PENDING": 1})


def test_an_array_under_the_jobcomp_file_is_found_by_the_raw_ids_the_job_wrote(tmp_path):
    """Without slurmdbd, accounting knows array tasks only by their raw ids (tasks/<task>.jobid)."""
    job = record(tmp_path, "40", array=[0, 1, 2], jobids={"0": 40, "1": 41, "2": 42})
    b = backend(sacct="40|40|COMPLETED|0:0|2026-11-22T16:00:05\n41|41|TIMEOUT|0:15|2026-11-22T16:00:05\n"
                      "42|42|COMPLETED|0:0|2026-11-22T16:00:05\n", source="jobcomp")
    assert states(b, job) == [{"0": ("COMPLETED", 0), "1": ("TIMEOUT", 0), "2": ("COMPLETED", 0)}]
    sacct = [c for c in b.slurm.run.calls if "sacct" in c]
    assert len(sacct) == 1 and sacct[0][2:4] == ["sacct", "-c"]


def test_many_jobs_cost_one_squeue_and_one_sacct(tmp_path):
    records = [record(tmp_path, str(100 + i), array=[0, 1] if i % 2 else None) for i in range(50)]
    b = backend(squeue="100|RUNNING|100|None\n")
    status_of = b.states(records)
    assert len(status_of) == 50 and status_of[records[0].job_dir]["0"].state == "RUNNING"
    assert calls(b) == ["squeue", "scontrol", "sacct"]  # scontrol once: the accounting source is remembered
    b.slurm.run.calls.clear()
    b.states(records)
    assert calls(b) == ["squeue", "sacct"]
    squeue = next(c for c in b.slurm.run.calls if c[0] == "squeue")
    assert squeue[squeue.index("-j") + 1] == ",".join(r.job_id for r in records)


def test_nothing_ended_asks_accounting_nothing(tmp_path):
    job = record(tmp_path, "50", array=[0, 1])
    b = backend(squeue="50_0|RUNNING|51|None\n50_1|PENDING|50|Resources\n")
    b.states([job])
    assert calls(b) == ["squeue"]


def test_array_tasks_that_never_started_share_one_accounting_row(tmp_path):
    """Cancelled while pending: slurmdbd keeps one row for the lot (30_[2-5]); each task is CANCELLED, not
    UNKNOWN (which `hpc wait` would poll for ever). Times come as epoch seconds (SLURM_TIME_FORMAT=%s)."""
    job = record(tmp_path, "30", array=list(range(6)))
    b = backend(sacct=f"30_0|31|COMPLETED|0:0|{SUBMITTED + 5:.0f}\n30_1|32|COMPLETED|0:0|{SUBMITTED + 6:.0f}\n"
                      "30_[2-5]|30|CANCELLED by 0|0:0|None\n")
    assert {t: s.state for t, s in b.states([job])[job.job_dir].items()} == {
        "0": "COMPLETED", "1": "COMPLETED", "2": "CANCELLED", "3": "CANCELLED", "4": "CANCELLED", "5": "CANCELLED"}


def test_a_job_that_shrank_is_read_by_its_last_row_not_its_resizing_one(tmp_path):
    """A job that gave nodes back (vetting releasing its spares) has a RESIZING row in the jobcomp file, with the
    same start as the COMPLETED row written after it; a requeued one has one more pair. Recorded from slurm-local
    (SLURM 22.05): `hpc wait` read RESIZING and waited for ever."""
    shrank, requeued = record(tmp_path, "81"), record(tmp_path, "82")
    at = f"{SUBMITTED + 7:.0f}"
    again = f"{SUBMITTED + 21:.0f}"
    b = backend(sacct=f"81|81|RESIZING|0:0|{at}\n81|81|COMPLETED|0:0|{at}\n"
                      f"82|82|RESIZING|0:0|{at}\n82|82|PENDING|0:0|{at}\n82|82|RESIZING|0:0|{again}\n"
                      f"82|82|FAILED|1:0|{again}\n", source="jobcomp")
    assert states(b, shrank, requeued) == [{"0": ("COMPLETED", 0)}, {"0": ("FAILED", 1)}]
