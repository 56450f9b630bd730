"""Find cluster profiles, follow ``extends:``, and validate them into ClusterProfile."""

from __future__ import annotations

from pathlib import Path

from hpc.cluster.config import files, safe_yaml
from hpc.cluster.config.schema import ClusterProfile
from hpc.cluster.folders import builtin_dir, note_once, replaces_builtin, search_path
from hpc.contract.validate import build, check_field, field_names, unknown_key_error
from hpc.errors import ConfigError, HpcError, shorten, shown

DEFAULT_PROFILE = "local"
MAX_EXTENDS_DEPTH = 16  # profiles along one 'extends' chain; real sites use two or three
_MERGED_MAPPINGS = ("env", "container", "preemption", "rendezvous")  # merged key by key along extends; the rest replace


def _is_path(ref: str) -> bool:
    return "/" in ref or ref.endswith((".yaml", ".yml"))


def find(ref: str, relative_to: Path | None = None) -> Path:
    """A profile by path or by name (./cluster_configs, then the user's folder, then built-in)."""
    if _is_path(ref):
        path = Path(ref).expanduser()
        if not path.is_absolute() and relative_to is not None:
            path = relative_to / path
        if not files.is_file(path):
            raise HpcError(f"profile file {shown(ref)} does not exist", fix="check the path")
        return path
    dirs = ([relative_to] if relative_to is not None else []) + search_path("cluster_configs")
    for d in dirs:
        for suffix in (".yaml", ".yml"):
            candidate = d / f"{ref}{suffix}"
            if files.is_file(candidate):
                _note_if_shadowing(candidate, ref)
                return candidate
    raise HpcError(f"no profile named {shown(ref)}",
                   fix=f"run 'hpc profile list', or give a path; searched {', '.join(str(d) for d in dirs)}")


def _note_if_shadowing(found: Path, name: str) -> None:
    """`./cluster_configs/local.yaml` replaces the built-in default profile: say so, once, rather than silently
    (unless it is the built-in's own text)."""
    builtin = builtin_dir("cluster_configs")
    if any(replaces_builtin(found, builtin / f"{name}{suffix}") for suffix in (".yaml", ".yml")):
        note_once(f"hpc: note: profile {found} takes the place of the built-in {name!r}")


def read_yaml(path: Path) -> dict:
    data = safe_yaml.load(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise HpcError("must hold a mapping of keys to values", where=str(path), fix="write 'key: value' lines")
    return data


def _chain(path: Path) -> list[tuple[Path, dict]]:
    """The profile and its ancestors along ``extends``, child first, each with its keys (``extends`` taken out).

    A loop, not recursion: a long chain is an error naming it, not a RecursionError."""
    chain: list[tuple[Path, dict]] = []
    seen: list[Path] = []
    while True:
        resolved = path.resolve()
        if resolved in seen:
            cycle = " -> ".join(str(p) for p in (*seen, resolved))
            raise HpcError(f"'extends' forms a cycle: {shorten(cycle, 1000)}", where=str(path),
                           fix="remove one of the 'extends' keys")
        if len(seen) == MAX_EXTENDS_DEPTH:
            names = " -> ".join(p.stem for p in seen[:4]) + " -> ... -> " + seen[-1].stem
            raise HpcError(f"'extends' goes more than {MAX_EXTENDS_DEPTH} levels deep ({names})",
                           where=str(chain[0][0]),
                           fix="let a profile extend one that extends no further, or a few levels of them")
        seen.append(resolved)
        data = read_yaml(path)
        chain.append((path, data))
        parent_ref = data.pop("extends", None)
        if parent_ref is None:
            return chain
        if not isinstance(parent_ref, str):
            raise ConfigError(str(path), "extends", parent_ref, "must be a profile name or path", "write extends: base")
        try:
            path = find(parent_ref, relative_to=path.parent)
        except HpcError as e:
            raise ConfigError(str(path), "extends", parent_ref, "names no profile", e.fix) from None


def _raw(path: Path) -> tuple[dict, dict[str, Path]]:
    """The profile's keys merged over its ancestors', and which file each key came from: each top-level key, and
    each key of a merged mapping as ``section.key``."""
    merged: dict = {}
    origin: dict[str, Path] = {}
    for file, data in reversed(_chain(path)):
        for key, value in data.items():
            if key in _MERGED_MAPPINGS and isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
                for dotted in [k for k in origin if k.startswith(f"{key}.")]:
                    del origin[dotted]  # replaced whole: its keys no longer come from the ancestor
            origin[key] = file
            if key in _MERGED_MAPPINGS and isinstance(value, dict):
                origin.update({f"{key}.{sub}": file for sub in value})
    return merged, origin


def load(ref: str | None = None) -> tuple[ClusterProfile, Path, dict[str, Path]]:
    """Load, merge and validate a profile -> (profile, its file, the file each key came from).

    Errors name the file that holds the offending key, also when an ancestor holds it.
    """
    path = find(ref or DEFAULT_PROFILE)
    data, origin = _raw(path)
    data.setdefault("name", path.stem)
    origin.setdefault("name", path)
    # validate key by key first so an error names the file the key came from, not the child's
    for key, value in data.items():
        build_one(key, value, str(origin[key]))
    return build(ClusterProfile, data, str(path)), path, origin


def build_one(key: str, value, source: str) -> None:
    if key not in field_names(ClusterProfile):
        raise unknown_key_error(source, key, value, field_names(ClusterProfile))
    check_field(ClusterProfile, key, value, source, key)


def available() -> list[tuple[str, Path]]:
    """Every profile name visible from here, first match winning, as ``hpc profile list`` shows them."""
    seen: dict[str, Path] = {}
    for d in search_path("cluster_configs"):
        if d.is_dir():
            for p in sorted([*d.glob("*.yaml"), *d.glob("*.yml")]):
                seen.setdefault(p.stem, p)
    return sorted(seen.items())
