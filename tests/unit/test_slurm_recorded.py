"""The SLURM seam against recorded command output: parsing and error handling without a cluster.
(The same code runs against the real on-machine cluster in test_slurm_jobs.py.)"""

import subprocess

import pytest

from hpc.errors import HpcError
from hpc.slurm.commands import EPOCH, Slurm, check_fits


class Recorded:
    """Answers each command from a table of (argv prefix -> (returncode, stdout, stderr)); keeps the calls."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def __call__(self, argv):
        self.calls.append(list(argv))
        for prefix, (rc, out, err) in self.answers:
            if list(argv[:len(prefix)]) == list(prefix):
                return subprocess.CompletedProcess(argv, rc, out, err)
        raise AssertionError(f"unexpected command {argv}")


def test_sbatch_parsable_drops_the_cluster_name():
    slurm = Slurm(Recorded([(["sbatch"], (0, "4242;perlmutter\n", ""))]))
    assert slurm.submit_argv(["sbatch", "--parsable", "--chdir=/work", "/j/job.sbatch"]) == "4242"
    assert slurm.run.calls[0] == ["sbatch", "--parsable", "--chdir=/work", "/j/job.sbatch"]


def test_sbatch_refusal_is_one_line_with_its_message():
    err = "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified\n"
    slurm = Slurm(Recorded([(["sbatch"], (1, "", err))]))
    with pytest.raises(HpcError) as e:
        slurm.submit_argv(["sbatch", "--parsable", "/j/job.sbatch"])
    assert "Invalid account or account/partition combination" in str(e.value) and "\n" not in str(e.value)


def test_squeue_lists_array_tasks_of_many_jobs_and_forgets_finished_jobs():
    out = "77_0|RUNNING|78|None\n77_1|RUNNING|79|None\n77_5|PENDING|77|Resources\n80|PENDING|80|Priority\n"
    slurm = Slurm(Recorded([(["squeue", "-h", "-r", "-j", "77,80"], (0, out, "")),
                            (["squeue", "-h", "-r", "-j", "5"],
                             (1, "", "slurm_load_jobs error: Invalid job id specified\n"))]))
    assert slurm.queue("77,80") == {"77_0": ("RUNNING", "78", "None"), "77_1": ("RUNNING", "79", "None"),
                                    "77_5": ("PENDING", "77", "Resources"), "80": ("PENDING", "80", "Priority")}
    assert slurm.queue("5") == {}


def test_accounting_falls_back_to_the_jobcomp_file_and_keeps_every_job_that_had_the_id():
    no_dbd = (1, "", "sacct: error: Slurm accounting storage is disabled\n")
    jobcomp = ("12|12|FAILED|3:0|2020-01-01T00:00:00\n"          # an older job 12, from before a reset
               "12|12|TIMEOUT|0:15|2026-11-22T16:00:05\n")
    slurm = Slurm(Recorded([([*EPOCH, "sacct", "-X"], no_dbd), ([*EPOCH, "sacct", "-c"], (0, jobcomp, ""))]))
    rows = slurm.accounting_many(["12"])
    assert [(s.state, s.exit_code) for s, _ in rows["12"]] == [("FAILED", 3), ("TIMEOUT", 0)]
    assert Slurm(Recorded([([*EPOCH, "sacct", "-X"], no_dbd),
                           ([*EPOCH, "sacct", "-c"], (0, "", ""))])).accounting_many(["12"]) == {}


def test_accounting_reads_cancelled_by_user_and_array_task_ids():
    out = "9|9|CANCELLED by 0|0:0|2026-11-22T16:00:05\n30_2|33|COMPLETED|0:0|2026-11-22T16:00:05\n"
    rows = Slurm(Recorded([([*EPOCH, "sacct", "-X"], (0, out, ""))])).accounting_many(["9", "30_2"], "dbd")
    assert rows["9"][0][0].state == "CANCELLED"
    assert rows["30_2"] == rows["33"] and rows["33"][0][0].state == "COMPLETED"


def test_the_accounting_source_comes_from_the_controllers_config():
    def source(text):
        return Slurm(Recorded([(["scontrol", "show", "config"], (0, text, ""))])).accounting_source()

    assert source("AccountingStorageType   = accounting_storage/slurmdbd\nJobCompType = jobcomp/none\n") == "dbd"
    assert source("AccountingStorageType   = accounting_storage/none\nJobCompType = jobcomp/filetxt\n") == "jobcomp"
    assert source("AccountingStorageType   = accounting_storage/none\nJobCompType = jobcomp/none\n") == "none"


PARTITION = ("PartitionName=gpu AllowGroups=ALL Default=NO MaxNodes=4 MaxTime=02:00:00 State=UP TotalNodes=16\n"
             "PartitionName=debug Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED State=UP TotalNodes=2\n")


@pytest.mark.parametrize("partition, nodes, time, gpus, message", [
    ("gpu", 8, "01:00:00", 0, "exceeds partition gpu's MaxNodes 4"),
    ("gpu", 2, "03:00:00", 0, "exceeds partition gpu's MaxTime 02:00:00"),
    ("gpu", 2, "01:00:00", 4, "partition gpu has no GPUs"),
    (None, 3, "01:00:00", 0, "exceeds partition debug's 2 nodes"),
    ("nope", 1, "01:00:00", 0, "partition 'nope' does not exist"),
])
def test_impossible_jobs_fail_at_submit(partition, nodes, time, gpus, message):
    answers = [(["scontrol", "show", "partition", "-o", "nope"], (1, "", "Partition nope not found\n")),
               (["scontrol", "show", "partition", "-o", "gpu"], (0, PARTITION.splitlines()[0], "")),
               (["scontrol", "show", "partition", "-o"], (0, PARTITION, "")),
               (["sinfo"], (0, "(null)\n", ""))]
    with pytest.raises(HpcError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_fits(Slurm(Recorded(answers)), partition, nodes, time, gpus)


def test_a_job_that_fits_passes():
    answers = [(["scontrol", "show", "partition", "-o", "gpu"], (0, PARTITION.splitlines()[0], "")),
               (["sinfo"], (0, "gpu:a100:4\n", ""))]
    check_fits(Slurm(Recorded(answers)), "gpu", 4, "02:00:00", 4)


# `scontrol show job -o` of a running job (Slurm 22.05.8 on slurm-local), cut to the fields that matter here
SHOW_JOB = ("JobId=57 JobName=train UserId=root(0) JobState={state} Reason=None Requeue=1 Restarts=0 "
            "RunTime=00:00:41 StartTime=2026-11-23T23:11:10 EndTime={end} Deadline=N/A "
            "PreemptEligibleTime=2026-11-23T23:11:10 PreemptTime={preempt} SuspendTime=None Partition=lowgrace")


@pytest.mark.parametrize(("state", "preempt", "expected"), [
    ("RUNNING", "2026-11-23T23:11:51", True),    # chosen for preemption, inside its grace time
    ("RUNNING", "None", False),                  # a cancel or a time limit: not preemption
    ("COMPLETING", "2026-11-23T23:11:51", False),  # GraceTime=0: SLURM is already requeueing it itself
])
def test_preempted_reads_preempt_time_of_a_running_job(state, preempt, expected):
    line = SHOW_JOB.format(state=state, preempt=preempt, end="2026-11-23T23:12:21")
    slurm = Slurm(Recorded([(["scontrol", "show", "job"], (0, line + "\n", ""))]))
    assert slurm.preempted("57") is expected
    assert slurm.run.calls == [["scontrol", "show", "job", "-o", "57"]]


def test_preempted_is_false_where_the_partition_cannot_be_preempted_or_the_job_is_gone():
    line = "JobId=57 JobName=train JobState=RUNNING Reason=None EndTime=Unknown Partition=debug"
    assert Slurm(Recorded([(["scontrol"], (0, line, ""))])).preempted("57") is False
    gone = (1, "", "slurm_load_jobs error: Invalid job id specified\n")
    assert Slurm(Recorded([(["scontrol"], gone)])).preempted("57") is False
