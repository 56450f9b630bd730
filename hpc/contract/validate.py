"""Turn plain mappings (YAML, environment strings, flags) into typed dataclasses, or fail with one line.

Each dataclass field may carry ``metadata={"check": fn}``; ``fn(value)`` returns the value to keep or
raises ``HpcError`` with a fix. Unknown keys and wrong types are errors that name the source and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Union

from hpc.errors import MISSING, ConfigError, HpcError

_HINTS: dict[type, dict[str, Any]] = {}
_FIELDS: dict[type, dict[str, dataclasses.Field]] = {}


def hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    if cls not in _FIELDS:
        _FIELDS[cls] = {f.name: f for f in dataclasses.fields(cls)}
    return _FIELDS[cls]


def field_names(cls: type) -> list[str]:
    return list(_fields(cls))


def unknown_key_error(source: str, key: object, value: object, known: list[str]) -> ConfigError:
    key = str(key)  # YAML reads `1: x` as an int key
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1].removeprefix("--set ")[:100], known, n=1)
    fix = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(known))}"
    return ConfigError(source, key, value, "unknown key", fix)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping of names to strings"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {str: "a string", int: "an integer", bool: "true or false", float: "a number"}.get(tp, str(tp))


def coerce(value: Any, tp: Any, source: str, key: str, *, from_text: bool = False) -> Any:
    """Check ``value`` against the annotation ``tp``; strings from the environment are parsed first."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return coerce(value, args[0], source, key, from_text=from_text)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        fix = f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(map(str, allowed))}"
        raise ConfigError(source, key, value, f"must be one of {', '.join(map(str, allowed))}", fix)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if from_text and isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(source, key, value, f"must be {_type_name(tp)}", "write a YAML list: [a, b]")
        return [coerce(v, item_tp, source, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if from_text and isinstance(value, str):
            pairs = [p for p in value.split(",") if p]
            if not all("=" in p for p in pairs):
                raise ConfigError(source, key, value, "must be NAME=VALUE pairs", "write A=1,B=2")
            value = dict(p.split("=", 1) for p in pairs)
        if not isinstance(value, dict):
            raise ConfigError(source, key, value, f"must be {_type_name(tp)}", "write a YAML mapping: {NAME: value}")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(source, f"{key}.{k}", v, "names must be strings", "quote the name")
            if isinstance(v, (list, dict)) or v is None:
                raise ConfigError(source, f"{key}.{k}", v, "must be a string", "quote the value")
            out[k] = v if isinstance(v, str) else _yaml_scalar_text(v)
        return out
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(source, key, value, "must be a mapping", "indent its keys under it")
        return build(tp, value, source, prefix=f"{key}.")
    if tp is bool:
        if from_text and isinstance(value, str):
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise ConfigError(source, key, value, "must be true or false", "write true or false")
    if tp is int:
        if from_text and isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(source, key, value, "must be an integer", "write a whole number like 4")
    if tp is float:
        if from_text and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(source, key, value, "must be a number", "write a number like 0.5")
    if tp is str:
        if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
            raise ConfigError(source, key, value, "must be a string", "quote the value")
        return value if isinstance(value, str) else _yaml_scalar_text(value)
    raise TypeError(f"unsupported annotation {tp!r} for {key}")  # a bug in a schema, not user input


def _yaml_scalar_text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def check_field(cls: type, name: str, value: Any, source: str, display_key: str, *, from_text: bool = False) -> Any:
    """Coerce and check one field of ``cls``."""
    field = _fields(cls)[name]
    value = coerce(value, hints(cls)[name], source, display_key, from_text=from_text)
    check = field.metadata.get("check")
    if check is not None and value is not None:
        try:
            value = check(value)
        except ConfigError:
            raise
        except HpcError as e:
            raise ConfigError(source, display_key, value, e.problem, e.fix) from None
    return value


def build(cls: type, data: dict, source: str, prefix: str = ""):
    """A ``cls`` instance from ``data``: unknown keys, wrong types and missing required keys are errors."""
    known = field_names(cls)
    for key, value in data.items():
        if key not in known:
            raise unknown_key_error(source, f"{prefix}{key}", value, known)
    kwargs = {k: check_field(cls, k, v, source, f"{prefix}{k}") for k, v in data.items()}
    for f in dataclasses.fields(cls):
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(source, f"{prefix}{f.name}", MISSING, "is required", f"add '{f.name}: ...'")
    obj = cls(**kwargs)
    post = getattr(obj, "validate", None)
    if post is not None:
        post(source)
    return obj


def to_plain(obj: Any) -> Any:
    """A dataclass tree -> plain dicts and lists (for YAML/JSON output)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj
