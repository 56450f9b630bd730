"""The local profile's ranks, forked from one Python that imported torch once (job_templates/local.sh.j2).

    python -m hpc.runtime.launch.local_ranks --nproc N [--log PATTERN] [--reason-file F] script.py [args]
                                                                                   (or --module MODULE [args])

Started as N new Pythons, every rank imports torch and hpc itself (~2.5 s of CPU each, all at once on the same
cores; 6 s more for a transformers model); forked from this one, they import it once between them: on a 2-core
machine 4 ranks reach their first line in about half the time. Each rank then runs the script as `python script.py`
would, line-buffered (hpc.runtime.launch.warm_launch.run_worker), with RANK and LOCAL_RANK set and, with --log, its
output in its own file ("{rank}" in PATTERN).

What the job script did for its ranks, this process does for them: a signal it gets is passed to every rank, and the
first rank to fail stops the others (TERM) with one line on stderr and one in --reason-file. It exits with that
rank's status (128 + the signal for a rank a signal ended, as bash reports it), else 0. A rank outlives this
process by nothing: each asks the kernel to kill it when its parent dies.

torch is imported before the script runs, as under hpc's torchrun (warm_launch): what torch reads as it is
imported (OMP_NUM_THREADS, MKL_NUM_THREADS, TORCH_LOGS) is set before the launch (`--env`, the profile), not by the
script itself; the transformers classes are warmed only for a script that leaves its environment alone.

The parent never touches a GPU, so its children start clean; were torch's CUDA initialized while warming all the
same, the ranks start as new Pythons instead of forks.
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hpc.runtime.launch.local_ranks")
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--log", help="each rank's output file, {rank} for its rank")
    parser.add_argument("--reason-file", help="where the line naming the rank that failed first is appended")
    parser.add_argument("--module", action="store_true", help="TARGET is a module (python -m)")
    parser.add_argument("target")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


# Libraries whose import costs seconds, imported here too when the script uses them (the names it takes from them):
# each is known not to start a thread or touch a GPU on import. transformers' models take 6 s a rank here.
WARM_LIBRARIES = ("transformers",)


def _warm(target: str, module: bool) -> None:
    """What every rank imports first anyway: torch, hpc's Accelerator, and of WARM_LIBRARIES what the script
    names. Nothing is imported that would make the forks unsafe: should torch's CUDA be initialized after all, the
    ranks are not forked (see main)."""
    import torch  # noqa: F401

    import hpc.runtime.accelerator  # noqa: F401

    if not module:
        for library, names in _named_from(target, WARM_LIBRARIES).items():
            try:
                imported = importlib.import_module(library)
                for name in names:
                    getattr(imported, name, None)  # transformers loads a model's module on first access
            except Exception:  # noqa: BLE001 - each rank imports it again itself and meets the error there
                pass


def _named_from(script: str, libraries: tuple[str, ...]) -> dict[str, set[str]]:
    """{library: names the script takes from it} for the libraries it imports (`from L import A`, `L.A`); nothing
    for a script that changes its environment (`os.environ[...] = `, `.setdefault`, `.update`, `putenv`): a library
    reads some variables as it is imported (transformers its cache and offline settings), so it must be imported
    after the script's own changes, by the rank."""
    try:
        tree = ast.parse(Path(script).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return {}
    if _changes_environment(tree):
        return {}
    found: dict[str, set[str]] = {}
    aliases: dict[str, str] = {}  # `import transformers as tf`: tf -> transformers
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in libraries:
                    found.setdefault(alias.name, set())
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in libraries:
            found.setdefault(node.module, set()).update(a.name for a in node.names if a.name != "*")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found[aliases[node.value.id]].add(node.attr)
    return found


def _die_with_parent(parent: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: a rank then outlives a killed parent, as a plain process would
        return
    if os.getppid() != parent:  # the parent died before the request took
        os._exit(128 + signal.SIGKILL)


def _rank(rank: int, opts: argparse.Namespace, parent: int, dispositions: dict) -> None:
    """The forked child: becomes rank ``rank`` and runs the script; never returns."""
    try:
        for sig, handler in dispositions.items():
            signal.signal(sig, handler)
        _die_with_parent(parent)
        os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
        if opts.log:
            fd = os.open(opts.log.replace("{rank}", str(rank)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        from hpc.runtime.launch.warm_launch import run_worker

        run_worker(opts.module, opts.target, *opts.args)
    except BaseException:  # noqa: BLE001 - nothing may return into the parent's loop
        import traceback

        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def _changes_environment(tree: ast.AST) -> bool:
    def is_environ(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
            (isinstance(node, ast.Name) and node.id == "environ")

    for node in ast.walk(tree):
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)) and \
                is_environ(node.value):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("setdefault", "update", "pop", "clear", "__setitem__") and \
                    is_environ(node.func.value):
                return True
            if node.func.attr in ("putenv", "unsetenv"):
                return True
    return False


def _cuda_initialized() -> bool:
    import torch

    return torch.cuda.is_initialized()


_STARTED: list = []


def _start(rank: int, opts: argparse.Namespace, dispositions: dict) -> int:
    """A rank as a new Python, for when forking is unsafe: the pid, waited for as a forked one. A signal this
    process inherited ignored (the early warning signal) is ignored in the rank too, as the job script left it:
    exec would reset this process's forwarding handler to the default, which ends the rank."""
    ignored = [sig for sig, handler in dispositions.items() if handler == signal.SIG_IGN]
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank)}
    target = ["-m", opts.target] if opts.module else [opts.target]
    out = None
    if opts.log:
        out = open(opts.log.replace("{rank}", str(rank)), "a")
    try:
        proc = subprocess.Popen([sys.executable, *target, *opts.args], env=env, stdout=out,
                                stderr=subprocess.STDOUT if out else None,
                                preexec_fn=lambda: [signal.signal(sig, signal.SIG_IGN) for sig in ignored])
        _STARTED.append(proc)  # kept: a collected Popen may reap its process before main's os.wait() sees it
        return proc.pid
    finally:
        if out:
            out.close()


def _status(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


def main(argv: list[str] | None = None) -> int:
    opts = _parse(sys.argv[1:] if argv is None else argv)
    nvml = "PYTORCH_NVML_BASED_CUDA_CHECK"
    asked = os.environ.get(nvml)
    os.environ[nvml] = "1"  # a torch.cuda.is_available() while warming leaves CUDA alone
    _warm(opts.target, opts.module)
    if asked is None:
        os.environ.pop(nvml)
    else:
        os.environ[nvml] = asked
    fork = not _cuda_initialized()
    ranks: dict[int, int] = {}  # pid -> rank, while it runs

    def forward(sig, _frame):
        for pid in list(ranks):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    # the handlers go in before the first fork, so a signal during the forks reaches the ranks already started
    dispositions = {sig: signal.getsignal(sig) for sig in FORWARDED}
    for sig in FORWARDED:  # also one this process inherited ignored: the ranks restore that and decide themselves
        signal.signal(sig, forward)
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    for rank in range(opts.nproc):
        if fork:
            pid = os.fork()
            if pid == 0:
                _rank(rank, opts, parent, dispositions)
        else:
            pid = _start(rank, opts, dispositions)
        ranks[pid] = rank
    rc = 0
    while ranks:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        rank = ranks.pop(pid, None)
        if rank is None:
            continue
        status = _status(wait_status)
        if status and not rc:
            rc = status
            print(f"hpc: rank {rank} exited with status {status}; stopping the other ranks", file=sys.stderr,
                  flush=True)
            if opts.reason_file:
                with open(opts.reason_file, "a") as f:
                    f.write(f"rank {rank} failed first (exit {status}); the other ranks were stopped\n")
            forward(signal.SIGTERM, None)
    return rc


if __name__ == "__main__":
    sys.exit(main())
