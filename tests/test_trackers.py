"""log_with as Accelerate takes it: names ("all" too), GeneralTracker subclasses, init_kwargs. One job of two
attempts (the first dies after a checkpoint) runs every installed tracker through the Accelerator, each library on
this machine only: W&B offline, MLflow in a file store, Comet as an offline experiment, Aim in a local repository,
ClearML as an offline session, DVCLive in local files; the tests read their files back. Aim and DVCLive are not in
the `test` extra (each adds ~30 s to its install): their checks run where they are installed."""

import csv
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from tests.jobhelpers import launch_env
from tests.unit.test_trackers import NEW, need

TRAIN = textwrap.dedent("""
    import json, sys, torch
    from hpc import Accelerator
    from hpc.tracking import GeneralTracker

    class Mine(GeneralTracker):
        name = "mine"
        def __init__(self):
            super().__init__()
            self.calls = []
        def start(self): self.calls.append("start")
        def store_init_configuration(self, values): self.calls.append(("config", values))
        def log(self, values, step=None, **kwargs): self.calls.append(("log", step, values, kwargs))
        def finish(self): self.calls.append("finish"); json.dump(self.calls, open(f"mine-{attempt}.json", "w"))

    attempt = int(sys.argv[1])
    mine = Mine()
    acc = Accelerator(project_dir="proj", log_with=["all", mine], auto_resume=True)
    acc.init_trackers("run", config={"lr": 0.1}, init_kwargs={"wandb": {"tags": ["hpc"]}})
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    while acc.completed_steps < 6:
        acc.backward(model(torch.ones(2, 4)).sum())
        opt.step()
        opt.zero_grad()
        acc.log({"value": acc.completed_steps * 10 + attempt, "note": "text"}, step=acc.completed_steps,
                log_kwargs={"mine": {"commit": True}})
        if acc.completed_steps == 3:
            acc.save_state()
        if acc.completed_steps == 4 and attempt == 0:
            acc.end_training()
            sys.exit(3)  # the first attempt dies after step 4: step 4 is logged, not checkpointed
    out = {"names": [t.name for t in acc._trackers], "wandb_tags": list(acc.get_tracker("wandb", unwrap=True).tags),
           "logging_dir": str(acc.logging_dir)}
    acc.end_training()
    json.dump(out, open("out.json", "w"))
""")


# steps 1-4 by the first attempt, 4-6 by the second after its resume from the checkpoint of step 3
BEFORE, AFTER = [(1, 10), (2, 20), (3, 30), (4, 40)], [(4, 41), (5, 51), (6, 61)]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("trackers")
    (tmp_path / "train.py").write_text(TRAIN)
    conf = tmp_path / "clearml.conf"  # ClearML's reporter in a thread: its subprocess takes 5-10 s to close
    conf.write_text("sdk { development { report_use_subprocess: false } }\n")
    env = {**launch_env(), "WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": "",
           "COMET_START_ONLINE": "false", "COMET_DISABLE_AUTO_LOGGING": "1", "CLEARML_OFFLINE_MODE": "1",
           "CLEARML_CACHE_DIR": str(tmp_path / "clearml-cache"), "CLEARML_CONFIG_FILE": str(conf),
           "DVC_NO_ANALYTICS": "1"}
    for attempt, code in ((0, 3), (1, 0)):
        proc = subprocess.run([sys.executable, "train.py", str(attempt)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == code, proc.stderr[-3000:]
    return tmp_path


def logs(job):
    """Where the trackers wrote: the Accelerator's logging_dir, relative to the job's folder."""
    return job / json.loads((job / "out.json").read_text())["logging_dir"]


def kept_id(job, name):
    ids = (logs(job) / f"run.{name}-run-id").read_text().split()
    assert len(ids) == 1  # kept by the first attempt, continued by the second
    return ids[0]


def test_all_trackers_and_a_users_own_continue_the_run_after_a_resume(job):
    tmp_path = job
    out = json.loads((tmp_path / "out.json").read_text())
    new = list(NEW)
    for name in new:
        need(name)
    assert {"comet_ml", "clearml"} <= set(new)  # in the test extra
    assert out.pop("logging_dir").startswith("proj")
    assert out == {"names": ["jsonl", "tensorboard", "wandb", "mlflow", *new, "mine"], "wandb_tags": ["hpc"]}
    folder = logs(job)
    # one run each, continued by the second attempt
    assert len((folder / "run.wandb-run-id").read_text().split()) == 1
    wandb_runs = list((folder / "wandb").glob("offline-run-*"))
    assert len({p.name.rsplit("-", 1)[-1] for p in wandb_runs}) == 1, wandb_runs
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

    run_id = (folder / "run.mlflow-run-id").read_text().strip()
    client = MlflowClient((folder / "mlruns").absolute().as_uri())
    history = [(m.step, m.value) for m in client.get_metric_history(run_id, "value")]
    assert history == [(1, 10.0), (2, 20.0), (3, 30.0), (4, 40.0), (4, 41.0), (5, 51.0), (6, 61.0)]
    assert client.get_run(run_id).data.params == {"lr": "0.1"}
    first, second = (json.loads((tmp_path / f"mine-{a}.json").read_text()) for a in (0, 1))
    assert first[:2] == ["start", ["config", {"lr": 0.1}]] and first[-1] == "finish"
    assert ["log", 1, {"value": 10, "note": "text"}, {"commit": True}] in first
    assert [c[1] for c in second if c[0] == "log"] == [4, 5, 6]


def test_comet_ml_offline_experiment_continues_under_its_key(job):
    key = kept_id(job, "comet_ml")
    archives = sorted((logs(job) / "comet_ml").glob("*.zip"), key=lambda p: p.stat().st_mtime)
    assert [a.name.split("-")[0] for a in archives] == [key, key]  # one archive per attempt, one experiment
    steps, experiments = [], []
    for archive in archives:
        with zipfile.ZipFile(archive) as z:
            experiments.append(json.loads(z.read("experiment.json")))
            messages = [json.loads(line) for line in z.read("messages.json").decode().splitlines() if line.strip()]
        params = {m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
                  for m in messages if m["type"] == "parameter_msg"}
        assert params["lr"] == 0.1
        assert ("note", "text") in [(m["payload"]["key"], m["payload"]["value"]) for m in messages
                                    if m["type"] == "log_other"]
        steps.append([(m["payload"]["metric"]["step"], m["payload"]["metric"]["metricValue"]) for m in messages
                      if m["type"] == "metric_msg" and m["payload"]["metric"]["metricName"] == "value"])
    assert steps == [BEFORE, AFTER]
    assert [e["project_name"] for e in experiments] == ["run", "run"]
    assert experiments[1]["resume_strategy"] == "get_or_create"


def test_aim_run_continues_in_the_logs_repository(job):
    need("aim")
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager

    run_hash, repo_dir = kept_id(job, "aim"), str(logs(job))
    repo = Repo.from_path(repo_dir)
    assert repo.list_all_runs() == [run_hash]
    RepoIndexManager.get_index_manager(repo).index(run_hash)  # what `aim up` does for a new run
    run = Repo.from_path(repo_dir).get_run(run_hash)
    assert run.name == "run" and run["hparams"] == {"lr": 0.1}
    steps, (values, *_) = next(m for m in run.metrics() if m.name == "value").data.numpy()
    # one run; step 4 logged again replaced the interrupted attempt's value
    assert list(zip(steps.tolist(), values.tolist())) == BEFORE[:3] + AFTER
    from aim.storage.context import Context

    assert len(run.get_text_sequence("note", Context({})).data.numpy()[0]) == 6  # text, as aim.Text


def test_clearml_offline_session_continues_the_same_task(job):
    task_id = kept_id(job, "clearml")
    assert task_id.startswith("offline-")
    offline = job / "clearml-cache" / "offline"
    assert [p.name for p in offline.iterdir() if p.is_dir()] == [task_id]  # one task, continued
    task = json.loads((offline / task_id / "task.json").read_text())
    assert task["name"] == "run" and task["configuration"]["General"]["value"] == "lr = 0.1"
    rows = [r for line in (offline / task_id / "metrics.jsonl").read_text().splitlines() if line.strip()
            for r in json.loads(line) if r.get("variant") == "train"]  # ClearML also copies TensorBoard's events
    # steps as logged (continue_last_task=0); text is dropped, as Accelerate drops it
    assert [(r["metric"], r["iter"], r["value"]) for r in rows] == [("value", *row) for row in BEFORE + AFTER]


def test_dvclive_resumes_its_folder_without_the_interrupted_steps(job):
    need("dvclive")
    live = logs(job) / "dvclive" / "run"
    assert os.path.samefile(job / kept_id(job, "dvclive"), live)  # as the job named it (the job's cwd)
    with open(live / "plots" / "metrics" / "value.tsv", newline="") as f:
        rows = [(int(r["step"]), int(r["value"])) for r in csv.DictReader(f, delimiter="\t")]
    # the interrupted attempt's step 4 is dropped at the resume, as TensorBoard purges it
    assert rows == BEFORE[:3] + AFTER
    assert (live / "params.yaml").read_text().split() == ["lr:", "0.1"]
    assert json.loads((live / "metrics.json").read_text())["value"] == 61


def test_tracker_names_hpc_cannot_start_are_one_line(tmp_path):
    script = textwrap.dedent("""
        import sys
        from hpc import Accelerator
        try:
            Accelerator(log_with=sys.argv[1]).init_trackers("run")
        except Exception as e:
            print(type(e).__name__, e)
    """)
    (tmp_path / "t.py").write_text(script)
    for name, expected in [("swanlab", "log_with='swanlab': the swanlab package is not installed"),
                           ("wandbb", "log_with='wandbb' is not a tracker hpc knows")]:
        proc = subprocess.run([sys.executable, "t.py", name], cwd=tmp_path, env=launch_env(), capture_output=True,
                              text=True, timeout=120)
        assert f"HpcError {expected}" in proc.stdout, proc.stdout + proc.stderr
