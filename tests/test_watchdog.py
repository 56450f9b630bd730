"""HangWatchdog with real processes and no mocks: a process that stops beating dumps its stacks and exits with
HANG_EXIT_CODE; nothing fires before the first beat, while paused, after stop() or once the script returns; two
gloo ranks, one stuck in plain Python while the other waits in all_reduce, are told apart; a main thread that
holds the GIL is still ended, by faulthandler's backstop.

The workers are functions of this file, run as `python tests/test_watchdog.py worker_NAME ARGS`: their names
are what the dumped stacks must show.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
HANG_EXIT_CODE = 87  # watchdog.HANG_EXIT_CODE, checked against the module in test_the_module_imports_no_torch
TIMEOUT = 3.0  # the hang timeout of most tests: a check every 0.75 s, the backstop 3.5 s after the timeout
QUIET = 1.0  # the timeout of the tests where nothing may fire: a check every 0.25 s, the backstop 2.5 s after


def _watchdog_module():
    """hpc.runtime.resilience.watchdog, loaded by its path: the package hpc.runtime imports torch (3 s a process on this
    machine), the module alone must not."""
    path = REPO / "hpc" / "runtime" / "resilience" / "watchdog.py"
    spec = importlib.util.spec_from_file_location("hpc_watchdog_by_path", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --- workers (run in child processes) -----------------------------------------------------------------------
def worker_hangs(report_dir: str, world_size: str, dumper: str) -> None:
    wd = _watchdog_module().HangWatchdog(TIMEOUT, 0, int(world_size), "hostA", report_dir or None)
    wd.start()
    if dumper == "faulthandler":
        wd.py_spy = None
    for step in range(3):
        wd.beat(f"step {step}")
        time.sleep(0.05)
    block_here_forever()


def block_here_forever() -> None:
    time.sleep(60)


def worker_quiet(case: str, marker: str) -> None:
    wd = _watchdog_module().HangWatchdog(QUIET, 0, 1, "hostA", None,
                                         before_exit=lambda why: Path(marker).write_text(why))
    wd.start()
    wd.start()  # idempotent
    idle = QUIET + wd.backstop_grace_s + 1.0  # past the timeout and past the backstop

    def armed() -> None:
        time.sleep(wd.check_every_s * 3)
        assert wd._backstop_at is not None, "the backstop was not armed: the case would prove nothing"

    if case == "before_first_beat":
        time.sleep(idle)
    elif case == "paused":
        wd.beat("step 0")
        armed()
        with wd.paused("checkpoint save"):
            time.sleep(idle)
        time.sleep(QUIET / 2)  # without the beat that ends a pause, the step-0 beat would be too old by now
    elif case == "stopped":
        wd.beat("step 0")
        armed()
        wd.stop()
        time.sleep(idle)
    elif case == "script_returns":
        wd.beat("step 0")
        armed()
        # the interpreter joins this thread after the script returns: no beats for longer than the timeout
        threading.Thread(target=time.sleep, args=(idle,)).start()
    elif case == "fork":
        wd.beat("step 0")
        armed()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # through the interpreter's own exit, which waits for faulthandler's timer thread
        until = time.monotonic() + 5
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > until:
                os.kill(pid, 9)
                raise SystemExit("the forked child hung at exit")
            wd.beat("waiting for the child")
            time.sleep(0.05)
        assert wd._backstop_at is not None, "the backstop was not armed again after the fork"
        wd.stop()
    print("quiet", case, flush=True)


def worker_gloo_rank(rank: str, store: str, report_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from hpc.runtime.resilience.watchdog import HangWatchdog

    me = int(rank)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=me, world_size=2)  # torch's 30 min timeout

    def before_exit(why: str) -> None:
        Path(report_dir, f"before_exit{me}.txt").write_text(why)

    wd = HangWatchdog(TIMEOUT, me, 2, f"node{me + 1}", report_dir, before_exit=before_exit)
    wd.start()
    for step in range(10_000):
        wd.beat(f"step {step}")
        if me == 1 and step == 3:
            stuck_in_plain_python()
        total = torch.ones(1)
        wd.beat("all_reduce")
        dist.all_reduce(total)
        time.sleep(0.01)


def worker_error_after_the_hang_is_declared(report_dir: str) -> None:
    """The main thread's wait breaks while the report is being made (as a peer that reported first and exited
    breaks this rank's all_reduce): the process still ends with the hang's code, its report whole."""
    wd = _watchdog_module().HangWatchdog(TIMEOUT, 0, 1, "hostA", report_dir,
                                         before_exit=lambda why: time.sleep(1.0))  # a slow end of the report
    wd.py_spy = None
    wd.start()
    wd.beat("all_reduce")
    while not wd._declared:
        time.sleep(0.02)
    raise RuntimeError("Connection closed by peer [127.0.0.1]:45207")


def stuck_in_plain_python() -> None:
    time.sleep(3600)


def worker_holds_gil() -> None:
    wd = _watchdog_module().HangWatchdog(TIMEOUT, 0, 1, "hostA", None)
    wd.start()
    for step in range(8):  # over 1 s: the watchdog thread has armed the backstop
        wd.beat(f"step {step}")
        time.sleep(0.15)
    hold_the_gil()


def hold_the_gil() -> None:
    import ctypes

    ctypes.PyDLL(None).sleep(60)  # libc's sleep; a PyDLL function keeps the GIL (a CDLL one would release it)


def worker_imports() -> None:
    module = _watchdog_module()
    print(json.dumps({"heavy": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy")),
                      "code": module.HANG_EXIT_CODE}))


# --- tests ---------------------------------------------------------------------------------------------------
def _start(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    from tests.jobhelpers import launch_env

    return subprocess.Popen([sys.executable, str(HERE), *args], cwd=tmp_path, env={**launch_env(), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout} s:\n{out}\n{err}") from None
    return proc.returncode, out, err


def test_the_module_imports_no_torch(tmp_path):
    code, out, err = _finish(_start(tmp_path, "worker_imports"), 30)
    assert code == 0, err
    got = json.loads(out)
    assert got == {"heavy": [], "code": HANG_EXIT_CODE}


def test_a_process_that_stops_beating_dumps_its_stack_and_exits(tmp_path):
    report = tmp_path / "hang"
    report.mkdir()
    (report / "rank1.host").write_text("hostB\n")  # a rank that started its watchdog, then went silent
    began = time.monotonic()
    with_dir = _start(tmp_path, "worker_hangs", str(report), "2", "faulthandler")
    stderr_only = _start(tmp_path, "worker_hangs", "", "1", "faulthandler")
    code, _, err = _finish(with_dir, TIMEOUT + 20)
    took = time.monotonic() - began
    assert code == HANG_EXIT_CODE, err
    assert took < TIMEOUT + 10, f"took {took:.1f} s"
    assert "block_here_forever" in err
    assert "block_here_forever" in (report / "rank0.stack").read_text()
    record = json.loads((report / "rank0.json").read_text())
    assert record["last_beat"] == "step 2" and record["rank"] == 0 and record["host"] == "hostA"
    assert record["pid"] == with_dir.pid and record["in_collective"] is False
    assert record["seconds_since_beat"] > TIMEOUT and record["dumper"] == "faulthandler"
    assert "block_here_forever (test_watchdog.py:" in record["where"]
    summary = (report / "summary.txt").read_text()
    assert "rank 0 on hostA is not in a collective" in summary
    assert "rank 1 on hostB did not report (process frozen or dead, or paused)" in summary
    assert err.count(summary.strip()) == 1  # the one summary line, in the rank's log too

    code, _, err = _finish(stderr_only, TIMEOUT + 20)
    assert code == HANG_EXIT_CODE, err
    assert "block_here_forever" in err and "rank 0 on hostA is not in a collective" in err
    assert not (tmp_path / "summary.txt").exists()


def test_an_error_in_the_main_thread_after_the_hang_is_declared_still_ends_with_the_hangs_code(tmp_path):
    report = tmp_path / "hang"
    code, _, err = _finish(_start(tmp_path, "worker_error_after_the_hang_is_declared", str(report)), TIMEOUT + 30)
    assert code == HANG_EXIT_CODE, err
    after = err.split("hpc: hang: after it was declared, this rank's main thread ended with RuntimeError:\n")[1]
    assert "in worker_error_after_the_hang_is_declared" in after  # its traceback, then the hang's own end
    assert "RuntimeError: Connection closed by peer" in after and "ending the process (exit code 87)" in after
    assert (report / "rank0.json").exists() and (report / "summary.txt").exists()


def test_nothing_fires_before_the_first_beat_while_paused_after_stop_or_after_the_script(tmp_path):
    cases = ["before_first_beat", "paused", "stopped", "script_returns", "fork"]
    procs = {case: _start(tmp_path, "worker_quiet", case, str(tmp_path / f"fired-{case}")) for case in cases}
    for case, proc in procs.items():
        code, out, err = _finish(proc, 30)
        assert code == 0 and f"quiet {case}" in out, f"{case}: exit {code}\n{err}"
        assert "hang" not in err and "Timeout" not in err, f"{case}:\n{err}"
        assert not (tmp_path / f"fired-{case}").exists(), case


def test_one_stuck_rank_of_two_is_named_and_both_end_long_before_the_gloo_timeout(tmp_path):
    report = tmp_path / "hang"
    began = time.monotonic()
    procs = [_start(tmp_path, "worker_gloo_rank", str(r), str(tmp_path / "store"), str(report)) for r in (0, 1)]
    results = [_finish(p, 120) for p in procs]
    took = time.monotonic() - began
    for code, _, err in results:
        assert code == HANG_EXIT_CODE, err
    assert took < 60, f"took {took:.1f} s"  # torch imports included; gloo alone would have waited 30 min
    summary = (report / "summary.txt").read_text().strip()
    assert "rank 1 on node2 is not in a collective (at stuck_in_plain_python" in summary, summary
    assert "likely stuck: see" in summary and "rank1.stack" in summary
    assert "rank 0 on node1 waits in a collective (all_reduce" in summary, summary
    assert "did not report" not in summary
    assert "stuck_in_plain_python" in (report / "rank1.stack").read_text()
    first, second = (json.loads((report / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first["in_collective"] is True and first["last_beat"] == "all_reduce"
    assert second["in_collective"] is False and second["last_beat"] == "step 3"
    # rank 0, the lowest that fired, summarized: its log has the line, and its before_exit got it
    assert results[0][2].count(summary) == 1 and summary not in results[1][2]
    assert (report / "before_exit0.txt").read_text() == summary
    assert "rank 1 on node2 is not in a collective" in (report / "before_exit1.txt").read_text()


def test_a_main_thread_holding_the_gil_is_ended_by_the_backstop(tmp_path):
    began = time.monotonic()
    code, _, err = _finish(_start(tmp_path, "worker_holds_gil"), 40)
    took = time.monotonic() - began
    assert code == 1, err  # faulthandler's _exit(1): the watchdog thread never got the GIL to exit with its own
    assert "Timeout (" in err and "hold_the_gil" in err, err
    assert "hpc: hang" not in err
    assert took < TIMEOUT + 2 * 0.75 + 2 + 5, f"took {took:.1f} s"


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def test_py_spy_dumps_the_stack_where_it_is_installed(tmp_path):
    import pytest

    if _py_spy() is None:
        pytest.skip("py-spy is not installed (faulthandler dumps instead; the other tests cover that)")
    report = tmp_path / "hang"
    code, _, err = _finish(_start(tmp_path, "worker_hangs", str(report), "1", "py-spy"), TIMEOUT + 30)
    assert code == HANG_EXIT_CODE, err
    record = json.loads((report / "rank0.json").read_text())
    stack = (report / "rank0.stack").read_text()
    assert record["dumper"] == "py-spy", stack
    assert "block_here_forever (" in stack and '"MainThread"' in stack  # py-spy's own format


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
