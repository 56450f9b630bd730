"""Small helpers shared by the submit tests: a project folder, running `hpc`, reading rank dumps."""

import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DUMP = textwrap.dedent("""
    import json, os, socket, sys, time
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
            "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID"]
    out = {"argv": sys.argv[1:], "host": socket.gethostname(), "cwd": os.getcwd(), "time": time.time(),
           "env": {k: os.environ.get(k) for k in keys}}
    name = "task%s-rank%s-job%s.json" % (os.environ.get("SLURM_ARRAY_TASK_ID", "0"), os.environ.get("RANK"),
                                         os.environ.get("SLURM_JOB_ID", "local"))
    path = os.path.join(os.environ["DUMP_DIR"], name)
    with open(path + ".part", "w") as f:  # whole or not at all: tests read the folder while tasks run
        json.dump(out, f)
    os.replace(path + ".part", path)
    print("dumped", name, flush=True)
    if os.environ.get("REQUEUE_ONCE") and os.environ.get("HPC_RESTART_COUNT", "0") == "0":
        open(os.environ["HPC_REQUEUE_FILE"], "a").close()  # the local profile runs the processes again
    if os.environ.get("SLEEP"):
        time.sleep(float(os.environ["SLEEP"]))
    sys.exit(int(os.environ.get("EXIT", "0")))
""")


def launch_env() -> dict:
    """This environment minus any rank/rendezvous/SLURM/hpc settings, with the repository importable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "HPC_", "TORCHELASTIC"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                      env.get("PYTHONPATH")]))
    return env


RESUME_WORKER = Path(__file__).resolve().parent / "resume_worker.py"
# resume_worker.py's trainings run straight through, one per training in the session: {key: [process, result]}
_STRAIGHT: dict[str, list] = {}
_STRAIGHT_NAMES = itertools.count()


def _straight_key(spec: dict) -> str:
    """A training, whatever its folders and pace: sleeping between steps changes no number."""
    return json.dumps({k: v for k, v in spec.items() if k not in ("project", "out", "sleep", "sleep_attempts")},
                      sort_keys=True)


def start_straight_run(spec: dict, folder: Path) -> None:
    """Start resume_worker.py's training `spec` straight through on `spec["nproc"]` (2) local ranks, in the
    background, in `folder`;
    unless this session has started it already: every test that compares with the same training (several do with
    DDP's 16 steps) shares one run, as each is ~12 s of CPU (two ranks importing torch) on a 2-core machine."""
    key = _straight_key(spec)
    if key in _STRAIGHT:
        return
    name = f"straight-{next(_STRAIGHT_NAMES)}"
    run = {**json.loads(key), "project": str(folder / name), "out": str(folder / f"{name}.pt")}
    with open(folder / f"{name}.stderr", "w") as err:  # a file, not a pipe no one reads until the run ends
        proc = subprocess.Popen([sys.executable, "-m", "hpc", "launch", "--nproc", str(spec.get("nproc", 2)),
                                 str(RESUME_WORKER),
                                 json.dumps(run)], cwd=folder, env=launch_env(), stderr=err)
    _STRAIGHT[key] = [proc, Path(run["out"])]


def straight_run(spec: dict, folder: Path) -> dict:
    """The result of start_straight_run(spec, folder), started now if it was not, waited for if it still runs."""
    import torch

    start_straight_run(spec, folder)
    key = _straight_key(spec)
    proc, out = _STRAIGHT[key]
    if isinstance(out, Path):
        try:
            proc.wait(timeout=600)
        finally:
            if proc.returncode != 0:  # failed or still running: a later test starts its own
                proc.kill()
                del _STRAIGHT[key]
        assert proc.returncode == 0, (out.parent / f"{out.stem}.stderr").read_text()[-3000:]
        _STRAIGHT[key][1] = torch.load(out, weights_only=False)
    return _STRAIGHT[key][1]


def make_project(tmp: Path) -> Path:
    (tmp / "dumps").mkdir(exist_ok=True)
    (tmp / "dump.py").write_text(DUMP)
    return tmp


def hpc(tmp: Path, *args, env=None, timeout=120, check=False):
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("HPC_", "SLURM_JOB", "MASTER_", "ACCELERATE_", "FSDP_"))}
    full.update({"XDG_CONFIG_HOME": str(tmp / "xdg-config"), "XDG_DATA_HOME": str(tmp / "xdg-data"),
                 "HF_HOME": str(tmp / "hf"),
                 "DUMP_DIR": str(tmp / "dumps"), **(env or {})})
    proc = subprocess.run([sys.executable, "-m", "hpc", *args], cwd=tmp, env=full, capture_output=True, text=True,
                          timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def submit(tmp: Path, *args, env=None, timeout=120) -> dict:
    proc = hpc(tmp, "submit", "--json", *args, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def status(tmp: Path, job_id: str) -> dict:
    return json.loads(hpc(tmp, "status", "--json", job_id, check=True).stdout)


def dumps(tmp: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp / "dumps").glob("*.json"))]


def where_am_i(x):
    """A function job: reports the rendezvous it sees (runs inside submitit tasks)."""
    import socket

    keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "HPC_RUNTIME_CONFIG"]
    return {"x": x, "host": socket.gethostname(), **{k: os.environ.get(k) for k in keys}}


class Resumable:
    """A function job that waits for the warning signal in its first attempt (x == 0); its checkpoint() asks
    for x + 1 next time, as a submitit Checkpointable would."""

    def __call__(self, x, started):
        if x == 0:
            Path(f"{started}{os.environ.get('RANK', '?')}").write_text("")  # the handler is in place by now
            time.sleep(120)
        return {"x": x, "restart": os.environ.get("HPC_RESTART_COUNT"), "rank": os.environ.get("RANK")}

    def checkpoint(self, x, started):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, x + 1, started)


def local_script_process(job_dir: Path, timeout: float = 60):
    """The running job.sh of a local job (under the recording wrapper and, with a limit, `timeout`)."""
    import psutil

    script, deadline = str(job_dir / "job.sh"), time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if len(cmd) == 2 and cmd[0].endswith("bash") and cmd[1] in (script, "job.sh"):
                return proc
        time.sleep(0.2)
    raise AssertionError(f"no process runs {script}")


TOKEN = "T0-secret-token-xyz"  # in the webhook's URL path, as real webhook URLs hold theirs


class Webhook:
    """A local HTTP endpoint that keeps what it is sent."""

    def __init__(self):
        self.messages: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                hook.messages.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/{TOKEN}"

    def events(self) -> list[str]:
        return [m["event"] for m in self.messages]
