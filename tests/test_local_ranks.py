"""hpc.runtime.launch.local_ranks, the local profile's launcher of more than one rank: the ranks are forked from
one warm Python and still behave as the separate processes the job script started before (their own RANK, output
file, __main__ and argv; a signal passed on; the first to fail stops the others and is named)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

RANK = textwrap.dedent("""
    import json, os, signal, sys, time
    here = sys.argv[1]
    mode = sys.argv[2]
    rank = int(os.environ["RANK"])
    def on_usr1(sig, frame):
        open(f"{here}/usr1-{rank}", "w").close()
        sys.exit(0)
    signal.signal(signal.SIGUSR1, on_usr1)
    print(json.dumps({"rank": rank, "local": os.environ["LOCAL_RANK"], "name": __name__, "argv": sys.argv,
                      "path0": sys.path[0], "torch_before": "torch" in sys.modules}))
    open(f"{here}/ready-{rank}", "w").close()
    if mode == "wait":
        while True:
            time.sleep(0.05)
    if mode == "fail" and rank == 1:
        while not all(os.path.exists(f"{here}/ready-{r}") for r in range(int(os.environ["WORLD_SIZE"]))):
            time.sleep(0.05)  # the others have written their line
        sys.exit(3)
    if mode == "kill" and rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode != "ok":
        time.sleep(60)  # the others are stopped long before
""")


def _start(tmp_path, mode, nproc=3, log=True):
    (tmp_path / "rank.py").write_text(RANK)
    cmd = [sys.executable, "-m", "hpc.runtime.launch.local_ranks", "--nproc", str(nproc),
           "--reason-file", str(tmp_path / "reason")]
    if log:
        cmd += ["--log", str(tmp_path / "rank{rank}.out")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")} | {"WORLD_SIZE": str(nproc)}
    return subprocess.Popen([*cmd, str(tmp_path / "rank.py"), str(tmp_path), mode], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(paths, timeout=120):
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"timed out waiting for {paths}"
        time.sleep(0.05)


def test_each_rank_runs_the_script_as_its_own_main_with_its_rank_and_output_file_and_gets_the_signal(tmp_path):
    proc = _start(tmp_path, "wait")
    _wait_for([tmp_path / f"ready-{r}" for r in range(3)])
    proc.send_signal(signal.SIGUSR1)  # as the job script passes the warning signal on
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert sorted(p.name for p in tmp_path.glob("usr1-*")) == ["usr1-0", "usr1-1", "usr1-2"]
    for r in range(3):
        seen = json.loads((tmp_path / f"rank{r}.out").read_text().splitlines()[0])
        assert seen == {"rank": r, "local": str(r), "name": "__main__", "argv": [str(tmp_path / "rank.py"),
                        str(tmp_path), "wait"], "path0": str(tmp_path), "torch_before": True}
    assert not (tmp_path / "reason").exists() and out == ""


def test_the_first_rank_to_fail_stops_the_others_and_is_named(tmp_path):
    proc = _start(tmp_path, "fail", log=False)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3
    assert "hpc: rank 1 exited with status 3; stopping the other ranks" in err
    assert (tmp_path / "reason").read_text() == "rank 1 failed first (exit 3); the other ranks were stopped\n"
    assert sorted(json.loads(line)["rank"] for line in out.splitlines()) == [0, 1, 2]  # each line whole


def test_a_rank_a_signal_ends_reports_the_status_bash_would(tmp_path):
    proc = _start(tmp_path, "kill")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL
    assert "rank 2 exited with status 137" in err
    assert (tmp_path / "reason").read_text().startswith("rank 2 failed first (exit 137)")


def test_where_forking_is_unsafe_the_ranks_start_as_new_pythons_and_behave_the_same(tmp_path):
    """Torch's CUDA initialized in the parent (a library did so on import) would break forked ranks' CUDA."""
    (tmp_path / "rank.py").write_text(RANK)
    run = ("import sys, hpc.runtime.launch.local_ranks as m; m._cuda_initialized = lambda: True; "
           "sys.exit(m.main(sys.argv[1:]))")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")} | {"WORLD_SIZE": "2"}
    done = subprocess.run([sys.executable, "-c", run, "--nproc", "2", "--reason-file", str(tmp_path / "reason"),
                           "--log", str(tmp_path / "rank{rank}.out"), str(tmp_path / "rank.py"), str(tmp_path),
                           "fail"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    for r in range(2):
        seen = json.loads((tmp_path / f"rank{r}.out").read_text().splitlines()[0])
        assert seen["rank"] == r and seen["name"] == "__main__" and not seen["torch_before"]
    assert (tmp_path / "reason").read_text() == "rank 1 failed first (exit 3); the other ranks were stopped\n"
