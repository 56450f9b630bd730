#!/usr/bin/env python3
"""Run Accelerate's own distributed test scripts under hpc, with only `accelerate` replaced by `hpc` in their imports.

Accelerate's wheel ships the scripts its CI runs on several processes (accelerate/test_utils/scripts/): test_ops.py
(the collectives), test_sync.py (gradient synchronisation and accumulation), test_script.py (state, data loaders,
training, triggers) and test_distributed_data_loop.py (even batches, join, stateful loaders). Each is a main() that
calls one check after another; here every check main() calls is one case, run on every rank by `hpc launch` on
2 CPU processes, and a case passes when it returns on every rank. A failing case is recorded and the script goes
on, so one failure does not hide the rest.

    python scripts/accelerate_conformance.py                 # downloads the wheel once (pip download), prints a table
    python scripts/accelerate_conformance.py --json          # for tests and scripts
    python scripts/accelerate_conformance.py --wheel accelerate-1.15.0-py3-none-any.whl --only test_ops

The wheel is only read: Accelerate is never installed or imported, so what runs is hpc's code.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ACCELERATE_VERSION = "1.15.0"
SCRIPTS = ["test_ops", "test_sync", "test_script", "test_distributed_data_loop", "test_ddp_comm_hook"]
# Accelerate runs this one on several GPUs only (its reference DDP model passes device_ids; torch's bf16 hooks
# need NCCL): here too
NEEDS_GPUS = {"test_ddp_comm_hook"}
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hpc" / "accelerate-conformance"
IMPORT_LINE = re.compile(r"^(\s*)(from|import)\s+accelerate(?=[\s.])", re.MULTILINE)

# Runs on every rank: loads the rewritten script as a module, wraps each function main() calls so that a failure
# is recorded (one JSON line per case, written as it ends, so a hang still leaves the cases before it), then main().
DRIVER = r'''
import ast, json, os, sys, traceback, types
script, out_dir = sys.argv[1], sys.argv[2]
rank = os.environ.get("RANK", "0")
source = open(script).read()
tree = ast.parse(source)
main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
called = {node.func.id for node in ast.walk(main) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
module = types.ModuleType("conformance_script")
module.__file__ = script
sys.modules["conformance_script"] = module
exec(compile(source, script, "exec"), module.__dict__)
log = open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a", buffering=1)
seen, depth = {}, [0]

def wrap(name, function):
    def case(*args, **kwargs):
        if depth[0]:
            return function(*args, **kwargs)
        seen[name] = seen.get(name, 0) + 1
        label = name if seen[name] == 1 else f"{name}#{seen[name]}"
        depth[0] += 1
        try:
            result = function(*args, **kwargs)
            log.write(json.dumps({"case": label, "ok": True}) + "\n")
            return result
        except BaseException as error:
            last = traceback.format_exception_only(type(error), error)[-1].strip()
            where = traceback.extract_tb(error.__traceback__)[-1]
            log.write(json.dumps({"case": label, "ok": False, "error": last[:300],
                                  "at": f"{os.path.basename(where.filename)}:{where.lineno}"}) + "\n")
        finally:
            depth[0] -= 1
    return case

for name in called:
    value = module.__dict__.get(name)
    if isinstance(value, types.FunctionType) and value.__module__ == "conformance_script" and name != "main":
        module.__dict__[name] = wrap(name, value)
try:
    module.main()
except BaseException as error:
    log.write(json.dumps({"case": "main", "ok": False,
                          "error": traceback.format_exception_only(type(error), error)[-1].strip()[:300]}) + "\n")
    raise
'''


def _gpu_count() -> int:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True)
    return int(probe.stdout.strip() or 0)


def find_wheel(given: str | None) -> Path:
    if given:
        return Path(given)
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob(f"accelerate-{ACCELERATE_VERSION}-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(CACHE),
                        f"accelerate=={ACCELERATE_VERSION}"], check=True)
        wheels = sorted(CACHE.glob(f"accelerate-{ACCELERATE_VERSION}-*.whl"))
    return wheels[0]


def as_hpc(source: str) -> str:
    """Only the import lines change: `from accelerate.x import y` becomes `from hpc.x import y`."""
    return IMPORT_LINE.sub(lambda m: f"{m.group(1)}{m.group(2)} hpc", source)


def run_script(name: str, wheel: Path, work: Path, timeout: float, processes: int, gpu: bool = False) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read(f"accelerate/test_utils/scripts/{name}.py").decode()
    script = work / f"{name}.py"
    script.write_text(as_hpc(source))
    out = work / f"{name}.results"
    out.mkdir()
    driver = work / "driver.py"
    driver.write_text(DRIVER)
    command = [sys.executable, "-m", "hpc", "launch", *([] if gpu else ["--cpu"]), "--num_processes", str(processes),
               str(driver), str(script), str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    try:
        run = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=timeout,
                             start_new_session=True)
        ended, output = ("exit %d" % run.returncode), run.stdout + run.stderr
    except subprocess.TimeoutExpired as expired:
        ended = f"hung (killed after {timeout:.0f} s)"
        output = (expired.stdout or b"").decode(errors="replace") + (expired.stderr or b"").decode(errors="replace")
        subprocess.run(["pkill", "-9", "-f", str(driver)], check=False)
    cases: dict[str, dict] = {}
    for rank_file in sorted(out.glob("rank*.jsonl")):
        for line in rank_file.read_text().splitlines():
            record = json.loads(line)
            case = cases.setdefault(record["case"], {"case": record["case"], "ok": True, "ranks": 0})
            case["ranks"] += 1
            if not record["ok"]:
                case["ok"] = False
                case.setdefault("error", f"{record['error']} ({record.get('at', '')})")
    if not cases:  # it stopped before main() reached a case: an import, the Accelerator's construction
        errors = [line.strip() for line in output.splitlines() if re.match(r"\s*[\w.]*(Error|Exception)\b", line)]
        cases["(start)"] = {"case": "(start)", "ok": False, "ranks": 0, "error": errors[-1] if errors else ended}
    for case in cases.values():
        if case["ranks"] < processes and case["ok"]:
            case["ok"], case["error"] = False, f"ended on {case['ranks']} of {processes} ranks"
    return {"script": name, "ended": ended, "seconds": round(time.monotonic() - started, 1),
            "cases": list(cases.values()), "output_tail": output[-3000:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", help=f"accelerate-{ACCELERATE_VERSION} wheel (default: pip download, cached)")
    parser.add_argument("--only", action="append", choices=SCRIPTS, help="run only this script (repeatable)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--gpu", action="store_true", help="one GPU per process (NCCL) instead of CPU ranks")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="print each script's output tail")
    args = parser.parse_args(argv)
    wheel = find_wheel(args.wheel)
    work = Path(tempfile.mkdtemp(prefix="hpc-conformance-"))
    results = []
    chosen = args.only or SCRIPTS
    gpus = _gpu_count()
    skipped = [name for name in chosen if name in NEEDS_GPUS and not (args.gpu and gpus >= args.processes)]
    try:
        for name in [n for n in chosen if n not in skipped]:
            if not args.json:
                print(f"{name} ...", file=sys.stderr, flush=True)
            results.append(run_script(name, wheel, work, args.timeout, args.processes, args.gpu))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"results": results, "not_run": skipped}, indent=1))
        return 0
    total = passed = 0
    for result in results:
        ok = sum(case["ok"] for case in result["cases"])
        total, passed = total + len(result["cases"]), passed + ok
        print(f"\n{result['script']}: {ok}/{len(result['cases'])} cases pass, {result['ended']}, {result['seconds']} s")
        for case in result["cases"]:
            print(f"  {'ok  ' if case['ok'] else 'FAIL'} {case['case']}" + ("" if case["ok"] else f": {case['error']}"))
        if args.verbose:
            print(result["output_tail"])
    for name in skipped:
        print(f"\n{name}: not run (it needs {args.processes} GPUs, as in Accelerate's own CI)")
    print(f"\n{passed} of {total} cases pass (Accelerate {ACCELERATE_VERSION}'s scripts, {args.processes} "
          f"{'GPU' if args.gpu else 'CPU'} ranks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
