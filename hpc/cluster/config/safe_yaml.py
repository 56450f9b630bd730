"""Load a YAML file (profile, job file, sweep file, Accelerate config) in bounded time and memory.

YAML aliases (``*name``) share one node, so a "billion laughs" file of a few hundred bytes holds billions of
values once anything walks it (a check, a repr in an error). The file is composed into nodes first, the values it
would expand to are counted (each shared node once, then multiplied), and only a file within the limits is built.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from hpc.cluster.config.files import read_text
from hpc.errors import HpcError

MAX_VALUES = 100_000  # scalars, lists and mappings, aliases expanded: a 10,000-point sweep list is ~50,000
MAX_DEPTH = 64  # nesting levels; hpc's deepest key is three levels down

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built in: parsing is 10x faster


def load(path: Path):
    """The file's data (None for an empty file), or HpcError naming the file (and line, for a syntax error)."""
    loader = _LOADER(read_text(path))
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node, path)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise HpcError(f"not valid YAML ({problem})", where=where, fix="fix the YAML syntax there") from None
    except ValueError as e:  # a scalar YAML reads as a number Python refuses to build (an int of 5,000 digits)
        raise HpcError(f"not a usable YAML value ({str(e)[:120]})", where=str(path),
                       fix="quote the value, or shorten it") from None
    finally:
        loader.dispose()


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_size(root: yaml.Node, path: Path) -> None:
    """Refuse a document whose aliases expand past MAX_VALUES, refer to themselves, or that nests past MAX_DEPTH.

    Iterative (a deep file must not exhaust the stack); each distinct node is visited once, so the count costs
    the file's size however far it would expand."""
    size: dict[int, int] = {}  # id(node) -> values it expands to, itself included
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            total = 1 + sum(size[id(c)] for c in _children(node))
            if total > MAX_VALUES:
                raise HpcError(f"holds more than {MAX_VALUES} values once its aliases (*name) are expanded",
                               where=str(path), fix="write the values out, or use fewer aliases of lists and mappings")
            size[key] = total
            continue
        if key in size:
            continue
        if key in on_path:
            raise HpcError("an alias (*name) refers to the list or mapping that holds it", where=str(path),
                           fix="remove the self-reference")
        if len(on_path) >= MAX_DEPTH:
            raise HpcError(f"nests deeper than {MAX_DEPTH} levels", where=str(path), fix="flatten it")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)
