"""The login side's rooms (each module or sub-package directly in hpc/cluster/) import each other one way only:
no cycle between rooms, function-level imports counted. Read from the code (AST), nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "hpc" / "cluster"


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["hpc", "cluster"] and len(parts) > 2 else None


def _edges() -> dict[tuple[str, str], list[str]]:
    """(room, room it imports) -> where, as file:line."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(CLUSTER.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        room = _room(".".join(parts))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from hpc.cluster import records` names the room in the imported name
                targets = [node.module] if _room(node.module) else [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                other = _room(target)
                if room and other and other != room:
                    edges.setdefault((room, other), []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return edges


def _cycle(edges) -> list[str] | None:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    done: set[str] = set()

    def walk(room: str, path: list[str]) -> list[str] | None:
        if room in path:
            return path[path.index(room):] + [room]
        if room in done:
            return None
        for nxt in sorted(graph.get(room, ())):
            found = walk(nxt, [*path, room])
            if found:
                return found
        done.add(room)
        return None

    for room in sorted(graph):
        found = walk(room, [])
        if found:
            return found
    return None


def test_no_cycle_between_the_rooms_of_hpc_cluster():
    edges = _edges()
    cycle = _cycle(edges)
    assert cycle is None, "a cycle between rooms of hpc/cluster:\n" + "\n".join(
        f"{a} -> {b}: {', '.join(edges[a, b])}" for a, b in zip(cycle, cycle[1:]))


def test_the_check_speaks():
    assert _cycle({("config", "backends"): [], ("backends", "render"): [], ("render", "config"): []}) == [
        "backends", "render", "config", "backends"]
    assert _cycle({("backends", "config"): [], ("render", "config"): []}) is None
    assert ("backends", "config") in _edges()  # the walk sees real imports
