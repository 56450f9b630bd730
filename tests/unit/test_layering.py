"""The house's layering, read from the code (AST, nothing imported): the rooms of docs/architecture.md.

    hpc.errors  <  hpc.slurm  <  hpc.contract  <  hpc.cluster | hpc.runtime  <  hpc.cli, hpc.api  <  re-export paths

An import may point to its own room or a lower one; the login side (cluster) and the job side (runtime) never
import each other; nothing below the entry points imports torch except the runtime; the Accelerate module paths
(and the old paths queued jobs still run) only re-export; and no two modules import each other, however far round.
"""

from __future__ import annotations

import ast
from pathlib import Path

HPC = Path(__file__).resolve().parents[2] / "hpc"
ENTRY = {"hpc", "hpc.__main__", "hpc.api"}
RANK = {"hpc.errors": 0, "hpc.slurm": 1, "hpc.contract": 2, "hpc.cluster": 3, "hpc.runtime": 3, "hpc.cli": 4,
        "hpc.api": 4, "hpc.__main__": 4}
TORCH_FREE = ("hpc.errors", "hpc.slurm", "hpc.contract", "hpc.cluster", "hpc.cli", "hpc.api")


def _modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(HPC.rglob("*.py")):
        parts = path.relative_to(HPC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = ast.parse(path.read_text(), str(path))
    return found


MODULES = _modules()


def _reexport(name: str) -> bool:
    """Accelerate's module paths (hpc.accelerator, hpc.state, hpc.utils.*, ...) and the paths kept for queued jobs."""
    top = name.count(".") == 1 and name not in RANK and name not in ENTRY
    return top or name.startswith(("hpc.utils", "hpc.test_utils"))


def _room(name: str) -> str:
    if _reexport(name):
        return "re-export"
    for room in sorted(RANK, key=len, reverse=True):
        if name == room or name.startswith(room + "."):
            return room
    return name


def _rank(name: str) -> int:
    return 5 if _reexport(name) else RANK.get(_room(name), 5)


def _imports(name: str, tree: ast.Module) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import, however deep in functions."""
    top_level = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from hpc.x import y` imports module hpc.x.y when there is one, else names of hpc.x
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
            targets = subs + ([node.module] if len(subs) < len(node.names) else [])
        else:
            continue
        out += [(t, node.lineno, id(node) in top_level) for t in targets]
    return out


def _hpc_target(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def test_every_import_points_to_its_own_room_or_a_lower_one():
    wrong = []
    for name, tree in MODULES.items():
        if name in ENTRY or _reexport(name):
            continue
        for target, line, _ in _imports(name, tree):
            dep = _hpc_target(target) if target.startswith("hpc") else None
            # the package itself holds the version and a lazy name table only: anything may read the version
            if dep is None or dep == "hpc" or _room(dep) == _room(name):
                continue
            across = {_room(name), _room(dep)} == {"hpc.cluster", "hpc.runtime"}
            if _rank(dep) > _rank(name) or across:
                wrong.append(f"{name}:{line} imports {dep} ({_room(name)} -> {_room(dep)})")
    assert not wrong, "imports that point up or across:\n" + "\n".join(wrong)


def test_torch_is_imported_by_the_runtime_only():
    wrong = []
    for name, tree in MODULES.items():
        if not name.startswith(TORCH_FREE):
            continue
        for target, line, top in _imports(name, tree):
            if target.split(".")[0] == "torch":
                wrong.append(f"{name}:{line} imports {target}")
            # the CLI may load the runtime for the commands that need it, inside them, never at import
            if top and target.startswith("hpc.runtime"):
                wrong.append(f"{name}:{line} imports {target} at module level")
    assert not wrong, "torch (or the runtime) on the torch-free side:\n" + "\n".join(wrong)


def _edges() -> dict[str, set[str]]:
    """Module -> the hpc modules it imports, function-level imports included."""
    graph = {name: set() for name in MODULES}
    for name, tree in MODULES.items():
        for target, _, _ in _imports(name, tree):
            dep = _hpc_target(target) if target.startswith("hpc") else None
            # a module's own packages are imported before it anyway: no edge back up to them
            if dep and dep != name and not name.startswith(dep + "."):
                graph[name].add(dep)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components: any component of two or more nodes is a cycle."""
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def _room_graph(package: str, graph: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """The rooms of ``package`` (a module or sub-package directly in it) -> the rooms they import, each edge with
    the imports that make it. The package itself is no room: importing it is importing its lazy names."""
    def room(name):
        return name[len(package) + 1:].split(".")[0] if name.startswith(package + ".") else None

    rooms: dict[str, dict[str, list[str]]] = {}
    for name, deps in graph.items():
        if (here := room(name)) is None:
            continue
        rooms.setdefault(here, {})
        for dep in deps:
            if (there := room(dep)) is not None and there != here:
                rooms[here].setdefault(there, []).append(f"{name} imports {dep}")
    return rooms


def _room_cycles(package: str, graph: dict[str, set[str]]) -> list[str]:
    rooms = _room_graph(package, graph)
    found = []
    for cycle in _cycles({room: set(deps) for room, deps in rooms.items()}):
        why = [f"  {a} -> {b}: {rooms[a][b][0]}" for a in cycle for b in cycle if b in rooms[a]]
        found.append(f"{package}: " + " <-> ".join(cycle) + "\n" + "\n".join(why))
    return found


def test_no_two_modules_import_each_other_however_far_round():
    cycles = _cycles(_edges())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_two_rooms_of_the_runtime_import_each_other_however_far_round():
    """A room (a module or sub-package directly in hpc/runtime) is what a reader takes in at once: two rooms that
    import each other, however far round and however deep inside a function, are one room in two places."""
    cycles = _room_cycles("hpc.runtime", _edges())
    assert not cycles, "import cycles between rooms:\n" + "\n".join(cycles)


def test_no_two_rooms_of_the_login_side_import_each_other_however_far_round():
    """The same rule for hpc/cluster (its 6-room cycle through backends, config, records, render and sweep is cut:
    what a scheduler takes of a job is asked from config/scheduler_keys.py, below the backends)."""
    cycles = _room_cycles("hpc.cluster", _edges())
    assert not cycles, "import cycles between rooms:\n" + "\n".join(cycles)


def _definitions(tree: ast.Module) -> list[str]:
    found = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # the docstring
            continue
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.startswith("_") for t in node.targets):
            continue  # __all__, and the name table of a lazy re-export
        if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__"):
            continue  # PEP 562: loads a re-exported name on first use, so importing the path stays cheap
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue  # `python -m hpc.functions` of a queued job
        found.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0][:60]}")
    return found


def test_accelerates_module_paths_only_re_export():
    paths = [name for name in MODULES if _reexport(name)]
    assert {"hpc.accelerator", "hpc.state", "hpc.utils", "hpc.utils.operations", "hpc.data_loader", "hpc.logging",
            "hpc.local_sgd", "hpc.tracking", "hpc.env", "hpc.functions"} <= set(paths)
    wrong = {name: found for name in paths if (found := _definitions(MODULES[name]))}
    assert not wrong, "definitions in re-export modules:\n" + "\n".join(f"{k}: {v}" for k, v in wrong.items())


def test_the_rules_catch_what_they_are_for():
    """The checks above are only worth their silence if they speak: each is fed a planted fault."""
    planted = ast.parse("import torch\nclass Thing:\n    pass\n")
    assert _definitions(planted) == ["line 2: class Thing:"]
    assert _room("hpc.cluster.records") == "hpc.cluster" and _room("hpc.state") == "re-export"
    assert _rank("hpc.contract.layout") < _rank("hpc.cluster.status") and _rank("hpc.slurm.hostlist") < _rank(
        "hpc.contract.layout")
    assert [t for t, _, _ in _imports("x", planted)] == ["torch"]
    # two rooms that import each other through a function-level import, three modules round
    inside = ast.parse("def f():\n    from hpc.runtime.b.y import z\n")
    assert ("hpc.runtime.b.y", 2, False) in _imports("hpc.runtime.a.x", inside)
    looped = {"hpc.runtime.a.x": {"hpc.runtime.b.y"}, "hpc.runtime.b.y": {"hpc.runtime.c"},
              "hpc.runtime.c": {"hpc.runtime.a.w"}, "hpc.runtime.a.w": set()}
    [said] = _room_cycles("hpc.runtime", looped)
    assert said.startswith("hpc.runtime: a <-> b <-> c") and "hpc.runtime.c imports hpc.runtime.a.w" in said
    assert not _cycles(looped)  # no module-level cycle: only the rooms see it


def test_the_architecture_page_names_every_module_of_the_three_rooms():
    """docs/architecture.md is the map a newcomer reads: a module it does not name is a room they cannot find."""
    page = (HPC.parent / "docs" / "architecture.md").read_text()
    missing = []
    for name in MODULES:
        parts = name.split(".")
        if len(parts) != 3 or parts[1] not in ("slurm", "contract", "cluster", "runtime"):
            continue
        spelled = f"`{parts[2]}/`" if (HPC / parts[1] / parts[2]).is_dir() else f"`{parts[2]}.py`"
        if spelled not in page:
            missing.append(f"{name} ({spelled})")
    assert not missing, "docs/architecture.md does not name:\n" + "\n".join(missing)


def test_the_paths_users_and_queued_jobs_run_still_work():
    """A job queued before the move runs `python -m hpc.script_checkpoints` and imports hpc.env; scripts import
    Accelerate's paths. Each answers as before (the module entry points print their usage and exit 2)."""
    import subprocess
    import sys

    for module in ("hpc.script_checkpoints", "hpc.runtime.checkpoint.script_resume"):
        proc = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "usage: python -m" in proc.stderr, (module, proc.stderr)
    every = sorted(name for name in MODULES if _reexport(name))
    code = (f"import importlib; [importlib.import_module(m) for m in {every!r}]; "
            "import hpc.env, hpc.functions, hpc.sanity; "
            "assert hpc.env.detect({'RANK': '1', 'WORLD_SIZE': '2', 'LOCAL_RANK': '1', 'MASTER_ADDR': 'n1', "
            "'MASTER_PORT': '29500'}).rank == 1; "
            "assert callable(hpc.functions.main) and callable(hpc.sanity.main)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_runtime_stays_a_house_of_rooms():
    """The runtime's root holds at most 15 modules, the rest in rooms; the Accelerator facade stays under 500
    lines (it delegates: Accelerate's breadth goes into more small modules, not a bigger class)."""
    root = [p for p in (HPC / "runtime").glob("*.py") if p.name != "__init__.py"]
    assert len(root) <= 15, sorted(p.name for p in root)
    lines = len((HPC / "runtime" / "accelerator.py").read_text().splitlines())
    assert lines < 500, f"hpc/runtime/accelerator.py has {lines} lines"
