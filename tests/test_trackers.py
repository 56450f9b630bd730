"""log_with as Accelerate takes it: names ("all" too), GeneralTracker subclasses, init_kwargs; W&B (offline) and
MLflow (file store) continue the same run when a job resumes from a checkpoint."""

import json
import os
import subprocess
import sys
import textwrap

from tests.jobhelpers import launch_env

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
        acc.log({"value": acc.completed_steps * 10 + attempt}, step=acc.completed_steps,
                log_kwargs={"mine": {"commit": True}})
        if acc.completed_steps == 3:
            acc.save_state()
        if acc.completed_steps == 4 and attempt == 0:
            acc.end_training()
            sys.exit(3)  # the first attempt dies after step 4: step 4 is logged, not checkpointed
    out = {"names": [t.name for t in acc._trackers], "wandb_tags": list(acc.get_tracker("wandb", unwrap=True).tags)}
    acc.end_training()
    json.dump(out, open("out.json", "w"))
""")


def test_all_trackers_and_a_users_own_continue_the_run_after_a_resume(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    env = {**launch_env(), "WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": ""}
    for attempt, code in ((0, 3), (1, 0)):
        proc = subprocess.run([sys.executable, "train.py", str(attempt)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == code, proc.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out == {"names": ["jsonl", "tensorboard", "wandb", "mlflow", "mine"], "wandb_tags": ["hpc"]}
    logs = tmp_path / "proj" / "logs"
    # one run each, continued by the second attempt
    assert len((logs / "run.wandb-run-id").read_text().split()) == 1
    wandb_runs = list((logs / "wandb").glob("offline-run-*"))
    assert len({p.name.rsplit("-", 1)[-1] for p in wandb_runs}) == 1, wandb_runs
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

    run_id = (logs / "run.mlflow-run-id").read_text().strip()
    client = MlflowClient((logs / "mlruns").absolute().as_uri())
    history = [(m.step, m.value) for m in client.get_metric_history(run_id, "value")]
    assert history == [(1, 10.0), (2, 20.0), (3, 30.0), (4, 40.0), (4, 41.0), (5, 51.0), (6, 61.0)]
    assert client.get_run(run_id).data.params == {"lr": "0.1"}
    first, second = (json.loads((tmp_path / f"mine-{a}.json").read_text()) for a in (0, 1))
    assert first[:2] == ["start", ["config", {"lr": 0.1}]] and first[-1] == "finish"
    assert ["log", 1, {"value": 10}, {"commit": True}] in first
    assert [c[1] for c in second if c[0] == "log"] == [4, 5, 6]


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
    for name, expected in [("comet_ml", "log_with='comet_ml' is not wired up in hpc yet"),
                           ("wandbb", "log_with='wandbb' is not a tracker hpc knows")]:
        proc = subprocess.run([sys.executable, "t.py", name], cwd=tmp_path, env=launch_env(), capture_output=True,
                              text=True, timeout=120)
        assert f"HpcError {expected}" in proc.stdout, proc.stdout + proc.stderr
