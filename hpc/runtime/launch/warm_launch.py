"""torchrun as hpc's SLURM jobs run it: the same arguments, agent and rendezvous, without a second import of torch.

    python -m hpc.runtime.launch.warm_launch [torchrun's arguments] script.py [args]   (or -m module [args])

Workers are forked from the agent, which imported torch to run at all, instead of started as new Pythons that
import it again (torchrun's own `--run-path` with `--start-method fork`, plus what running a script needs): every
start and every restart after a lost node saves the ~2 s import (more while all of a node's ranks import at once on
busy cores). The agent never touches a GPU, so its children start clean.

(The rendezvous' own 1 s poll of its store is torch's and stays: polling it faster would save ~1 s a restart, but a
first round's last call would then end up to a second sooner, and under load a late node already misses it.)

A worker runs the script as `python script.py` would, its output line-buffered: the script's folder first on
sys.path, an uncaught exception through sys.excepthook (sys.last_value set, as hpc's timeline reads it), atexit
handlers, exit status 1 (forked workers otherwise skip the last two: multiprocessing ends them with os._exit).
"""

from __future__ import annotations

import os
import runpy
import sys


def run_worker(module: bool, target: str, *args: str) -> None:
    """One worker: the script (or module) as the interpreter would run it, then exit with its status."""
    from hpc.runtime.process.excepthook import _exit, finish

    for stream in (sys.stdout, sys.stderr):  # a rank's lines reach the log as they are written, each whole
        try:
            stream.reconfigure(line_buffering=True, write_through=False)  # one write a line, also under -u
        except (AttributeError, ValueError):
            pass
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # torchrun sets it for the workers after the agent's torch read it
        import torch

        torch.set_num_threads(int(threads))
    code = 0
    try:
        if module:
            sys.argv = [target, *args]
            sys.path[0:0] = [os.getcwd()]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            sys.path[0:0] = [os.path.dirname(os.path.abspath(target))]
            runpy.run_path(target, run_name="__main__")
    except SystemExit as stop:
        code = _exit_status(stop.code)
    except BaseException:  # noqa: BLE001 - as the interpreter would: report it, then exit 1
        kind, value, tb = sys.exc_info()
        sys.last_type, sys.last_value, sys.last_traceback = kind, value, tb
        sys.excepthook(kind, value, tb)  # hpc's hook may end the process itself, with its own status
        code = 1
    if code:
        _exit(code)  # the agent sees the worker's exit status, as it would a process's
    # success: the agent also waits for the function's return value (torch's worker wrapper sends it on return),
    # so finish as the interpreter would, then return; multiprocessing then ends the process with status 0
    finish()


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"), as Python prints it
    return 1


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run as torchrun

    args = torchrun.parse_args(argv)
    if not args.no_python and not args.run_path:  # a binary, or torchrun's own in-process run: nothing to add
        # torchrun's --run-path calls run_script_path(script, *args) in each worker: ours also runs modules
        module = args.module

        def run_script_path(target: str, *script_args: str) -> None:
            run_worker(module, target, *script_args)

        torchrun.run_script_path = run_script_path
        args.run_path, args.start_method = True, "fork"
    torchrun.run(args)


if __name__ == "__main__":
    main()
