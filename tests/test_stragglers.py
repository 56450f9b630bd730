"""The straggler check on 2 real ranks (gloo, DDP, started here with the standard variables: `hpc launch` would
run them in a throwaway local job of its own, with its own job folder and runtime config). Rank 1 sleeps after
each step, so its own part of a step is far longer than rank 0's while their whole steps take the same time (the
all-reduce waits for it). It is named in the log, tasks/0.stragglers and the trackers, once; with straggler_action
"requeue" every rank stops at the same step, after a checkpoint, exits 0, and the job script is asked to requeue
without rank 1's node. (The rules themselves: tests/unit/test_stragglers.py.)"""

import json
import socket
import subprocess
import sys
import textwrap

from hpc.contract.runtime_config import RuntimeConfig
from tests.jobhelpers import launch_env

WORKER = textwrap.dedent("""
    import sys, time, torch
    from hpc import Accelerator
    acc = Accelerator(cpu=True, project_dir=sys.argv[1] + "/proj")
    acc.init_trackers("run")
    model = torch.nn.Linear(4, 1)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    for step in range(12):
        acc.backward(model(torch.ones(2, 4)).sum())
        opt.step()
        opt.zero_grad()
        acc.preemption_point()
        if acc.process_index == 1:
            time.sleep(0.06)  # rank 1's own part of each step: its node is the slow one
    acc.end_training()
    print("finished", acc.process_index, flush=True)
""")


class Ranks:
    """Two ranks of one job, as a job script would start them (its folder, runtime config, requeue file)."""

    def __init__(self, folder, action: str | None):
        self.folder = folder
        (folder / "job" / "tasks").mkdir(parents=True)
        (folder / "w.py").write_text(WORKER)
        RuntimeConfig(straggler_action=action).write(folder / "runtime.json")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**launch_env(), "HPC_RUNTIME_CONFIG": str(folder / "runtime.json"), "HPC_JOB_DIR": str(folder / "job"),
               "HPC_TASK": "0", "HPC_STRAGGLER_WINDOW_STEPS": "4", "HPC_STRAGGLER_WINDOW_S": "0",
               "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if action == "requeue":
            env["HPC_REQUEUE_FILE"] = str(folder / "requeue")
        self.procs = [subprocess.Popen([sys.executable, "w.py", str(folder)], cwd=folder, text=True,
                                       env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in (0, 1)]

    def wait(self) -> tuple[list[int], str, str]:
        ends = [p.communicate(timeout=120) for p in self.procs]
        return [p.returncode for p in self.procs], "".join(o for o, _ in ends), "".join(e for _, e in ends)


def test_a_slow_rank_is_named_and_with_requeue_the_job_stops_without_its_node(tmp_path):
    host = socket.gethostname()
    warn = Ranks(tmp_path / "warn", None)  # side by side: two short runs of 2 ranks each
    requeue = Ranks(tmp_path / "requeue", "requeue")
    codes, out, err = warn.wait()
    assert codes == [0, 0], err[-3000:]
    assert out.count("finished") == 2, out  # warn: the run goes on to its end
    named = f"hpc: straggler: rank 1 on {host} takes "
    assert err.count(named) == 1 and "at step 8)" in err, err[-3000:]  # windows end at 4, 8, 12: named once
    job = warn.folder / "job" / "tasks"
    lines = [json.loads(line) for line in (job / "0.stragglers").read_text().splitlines()]
    assert [(e["rank"], e["host"], e["step"], e["action"]) for e in lines] == [(1, host, 8, "warn")]
    assert lines[0]["ratio"] > 5  # 60 ms against a step's own part of a few ms
    assert not (job / "0.excluded").exists()
    rows = [json.loads(line) for f in (warn.folder / "proj").rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert [(row["step"], row["hpc/straggler_rank"]) for row in rows if "hpc/straggler_ratio" in row] == [(8, 1)]

    codes, out, err = requeue.wait()
    assert codes == [0, 0], err[-3000:]  # every rank exits 0: the job script requeues
    assert "finished" not in out and "Traceback" not in err, err[-3000:]
    assert f"checkpointing and requeueing without {host}" in err
    assert f"stop requested (straggler: rank 1 on {host} (" in err and "saved " in err, err[-3000:]
    assert (requeue.folder / "proj" / "checkpoints" / "step-8" / "manifest.json").exists()  # at the step boundary
    assert (requeue.folder / "requeue").read_text().startswith(f"straggler: rank 1 on {host} (")
    excluded = (requeue.folder / "job" / "tasks" / "0.excluded").read_text().splitlines()
    assert len(excluded) == 1 and excluded[0].startswith(f"{host} straggler (") and excluded[0].endswith(
        "x the median)")
