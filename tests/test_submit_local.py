"""`hpc submit --profile local`: the same job contract without SLURM (input refused before a job starts:
tests/unit/test_submit_local.py)."""

import json
import os
import subprocess
import time

import pytest

from tests.jobhelpers import TOKEN, Webhook, dumps, hpc, make_project, status, submit


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path)


def test_local_job_has_the_rank_contract(project):
    info = submit(project, "-p", "local", "--nproc", "2", "dump.py", "--", "a b", "$(x)")
    assert hpc(project, "wait", info["job_id"]).returncode == 0
    ranks = dumps(project)
    assert [r["env"]["RANK"] for r in ranks] == ["0", "1"]
    assert [r["env"]["LOCAL_RANK"] for r in ranks] == ["0", "1"]
    assert {(r["env"]["WORLD_SIZE"], r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in ranks} == {
        ("2", "127.0.0.1", ranks[0]["env"]["MASTER_PORT"])}
    assert all(r["argv"] == ["a b", "$(x)"] for r in ranks)
    assert status(project, info["job_id"])["state"] == "COMPLETED"
    logs = hpc(project, "logs", "--all", info["job_id"], check=True).stdout
    assert "[rank0] dumped task0-rank0-joblocal.json" in logs and "[rank1] dumped task0-rank1-joblocal.json" in logs


def test_the_torch_example_runs_on_the_local_profile(project):
    example = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "examples", "hello_ranks.py")
    proc = hpc(project, "submit", "-p", "local", "--nproc", "2", "--wait", "--no-snapshot", example, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = hpc(project, "logs", "--all", check=True).stdout
    assert out.count("all_reduce=1 ok") == 2


def test_failed_job_reports_its_exit_code(project):
    info = submit(project, "-p", "local", "dump.py", env={"EXIT": "3"})
    assert hpc(project, "wait", info["job_id"]).returncode == 3
    st = status(project, info["job_id"])
    assert (st["state"], st["exit_code"]) == ("FAILED", 3)
    assert hpc(project, "submit", "-p", "local", "--wait", "dump.py", env={"EXIT": "3"}).returncode == 3


def test_notify_hears_a_local_job_start_run_again_and_end(project):
    """The local profile sends the notices a SLURM job does: started, requeued at each round, then completed, or
    failed with its reason; the webhook URL (its token) is in none of them."""
    hook = Webhook()
    try:
        done = submit(project, "-p", "local", "--notify", hook.url, "dump.py", env={"REQUEUE_ONCE": "1"})
        assert hpc(project, "wait", done["job_id"]).returncode == 0
        assert hook.events() == ["started", "requeued", "completed"], hook.messages
        assert "round 1" in hook.messages[1]["text"]
        hook.messages.clear()
        failed = submit(project, "-p", "local", "--nproc", "2", "--notify", hook.url, "dump.py", env={"EXIT": "3"})
        assert hpc(project, "wait", failed["job_id"]).returncode == 3
        assert hook.events() == ["started", "failed"], hook.messages
        assert "exit 3" in hook.messages[1]["text"] and "failed first (exit 3)" in hook.messages[1]["text"]
        assert all(TOKEN not in json.dumps(message) for message in hook.messages)
    finally:
        hook.server.shutdown()


def test_time_limit_ends_the_job_as_timeout(project):
    info = submit(project, "-p", "local", "--time", "0:02", "dump.py", env={"SLEEP": "60"})
    t0 = time.monotonic()
    assert hpc(project, "wait", info["job_id"]).returncode != 0
    assert time.monotonic() - t0 < 30
    assert status(project, info["job_id"])["state"] == "TIMEOUT"


def test_cancel_stops_every_process(project):
    info = submit(project, "-p", "local", "--nproc", "2", "dump.py", env={"SLEEP": "300"})
    deadline = time.monotonic() + 60
    while len(dumps(project)) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    hpc(project, "cancel", info["job_id"], check=True)
    assert status(project, info["job_id"])["state"] == "CANCELLED"
    leftover = subprocess.run(["pgrep", "-f", str(project / "hpc-jobs")], capture_output=True, text=True).stdout
    assert leftover.strip() == ""


def test_snapshot_keeps_the_code_as_submitted(project):
    (project / "msg.txt").write_text("before\n")
    (project / "show.py").write_text(
        "import time, pathlib\ntime.sleep(1.5)\nprint(pathlib.Path('msg.txt').read_text().strip())\n")
    info = submit(project, "-p", "local", "show.py")
    (project / "msg.txt").write_text("after\n")  # an edit while the job is queued or running
    assert hpc(project, "wait", info["job_id"]).returncode == 0
    assert hpc(project, "logs", info["job_id"], check=True).stdout.strip() == "before"
    record = json.loads((project / "hpc-jobs").glob("show-*/record.json").__next__().read_text())
    assert record["snapshot"]["files"] >= 3 and record["workdir"].endswith("/code")


def test_no_snapshot_runs_from_here(project):
    info = submit(project, "-p", "local", "--no-snapshot", "dump.py")
    hpc(project, "wait", info["job_id"], check=True)
    assert dumps(project)[0]["cwd"] == str(project)


def test_dry_run_shows_what_submit_writes(project):
    dry = json.loads(hpc(project, "submit", "--dry-run", "--json", "-p", "local", "--nproc", "2", "dump.py",
                         check=True).stdout)
    info = submit(project, "-p", "local", "--nproc", "2", "dump.py")
    hpc(project, "wait", info["job_id"], check=True)
    written = (project / "hpc-jobs" / os.path.basename(info["job_dir"]) / "job.sh").read_text()
    assert dry["script"].replace(dry["job_dir"], info["job_dir"]) == written
    assert not any("YYYY" in p.name for p in (project / "hpc-jobs").iterdir())


def test_list_shows_recent_jobs(project):
    a = submit(project, "-p", "local", "-J", "first", "dump.py")
    b = submit(project, "-p", "local", "-J", "second", "dump.py")
    for info in (a, b):
        hpc(project, "wait", info["job_id"], check=True)
    rows = json.loads(hpc(project, "list", "--json", check=True).stdout)
    assert [r["name"] for r in rows[:2]] == ["second", "first"]
    assert {r["state"] for r in rows[:2]} == {"COMPLETED"}


def test_logs_follow_ends_with_the_job(project):
    (project / "talk.py").write_text(
        "import time\nprint('one', flush=True)\ntime.sleep(1.5)\nprint('two', flush=True)\n")
    info = submit(project, "-p", "local", "talk.py")
    proc = hpc(project, "logs", "-f", info["job_id"], timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["one", "two"]


def test_snapshot_without_git_follows_include_and_exclude(project):
    (project / "data").mkdir()
    (project / "data" / "big.bin").write_bytes(b"x" * 1000)
    (project / "data" / "labels.csv").write_text("a,b\n")
    (project / "secret.env").write_text("TOKEN=x\n")
    (project / "notes.md").write_text("hi\n")
    (project / "job.yaml").write_text("snapshot_include: ['*.py', '*.csv', '*.md']\nsnapshot_exclude: [notes.md]\n")
    info = submit(project, "-p", "local", "--config", "job.yaml", "dump.py")
    hpc(project, "wait", info["job_id"], check=True)
    code = {str(p.relative_to(project / info["job_dir"] / "code")) for p in
            (project / info["job_dir"] / "code").rglob("*") if p.is_file()}
    assert code == {"dump.py", "data/labels.csv"}  # job.yaml and notes.md are not included or are excluded
