"""A resumed run goes on with the same tracker run: one TensorBoard folder, each step once, the newer value."""

import json
import subprocess
import sys
import textwrap

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.jobhelpers import launch_env

TRAIN = textwrap.dedent("""
    import sys, torch
    from hpc import Accelerator
    attempt = int(sys.argv[1])
    acc = Accelerator(project_dir="proj", log_with="tensorboard", auto_resume=True)
    acc.init_trackers("run")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    while acc.completed_steps < 8:
        acc.backward(model(torch.ones(2, 4)).sum())
        opt.step()
        opt.zero_grad()
        acc.log({"value": acc.completed_steps * 10 + attempt}, step=acc.completed_steps)
        if acc.completed_steps == 4:
            acc.save_state()
        if acc.completed_steps == 6 and attempt == 0:
            sys.exit(3)  # the first attempt dies after step 6: steps 5 and 6 are logged but not checkpointed
    acc.end_training()
""")


def test_a_resumed_run_continues_the_same_tensorboard_and_jsonl_run(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    for attempt, code in ((0, 3), (1, 0)):
        proc = subprocess.run([sys.executable, "train.py", str(attempt)], cwd=tmp_path, env=launch_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == code, proc.stderr
    # TensorBoard's run where Accelerate puts it (project_dir/<project_name>); hpc's JSONL in project_dir/logs
    runs = [p for p in (tmp_path / "proj").iterdir() if p.is_dir() and p.name not in ("logs", "checkpoints")]
    assert [p.name for p in runs] == ["run"]
    events = EventAccumulator(str(runs[0]))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("value")]
    assert logged == [(s, s * 10 + (1 if s > 4 else 0)) for s in range(1, 9)], logged
    rows = [json.loads(line) for line in (tmp_path / "proj" / "logs" / "run.jsonl").read_text().splitlines()]
    marker = next(i for i, r in enumerate(rows) if "resumed_at" in r)
    assert rows[marker]["resumed_at"] == 4
    assert [r["step"] for r in rows[marker + 1:]] == [5, 6, 7, 8]
