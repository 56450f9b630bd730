"""The project's one error type for user mistakes, and how an error shows what the user gave.

A user mistake (bad profile, flag, hostlist, time limit, ...) is reported as one line and exit code 2;
anything else is a bug and keeps its traceback. A value quoted in an error is shortened (a YAML alias bomb or a
pasted file must not make a 200 MB "line") and a secret's value is never echoed.
"""

from __future__ import annotations

import functools
import re

EXIT_USER_ERROR = 2
SHOWN_CHARS = 80  # the most characters an error spends on one value
MAX_LINE_CHARS = 2000  # the most an error line takes, however many values it quotes
REDACTED = "<redacted>"

# Patterns as text: re compiles (and caches) them on first use, not on every CLI start.
# Names that hold credentials: WANDB_API_KEY, HF_TOKEN, db_password, aws_secret_access_key, ssh_key, ... Wider
# than what checks.env_values refuses: hiding too much in an error costs nothing, refusing too much blocks jobs.
_SECRET_PART = r"(?i)TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"
_SECRET_WORD = r"(?i)(?:^|[^A-Za-z0-9])(?:KEY|KEYS|AUTH|PAT)(?:$|[^A-Za-z0-9])"
# NAME=value inside a string ("WANDB_API_KEY=abc", "A=1,HF_TOKEN=x", "--api_key=abc"): the value is hidden
_ASSIGNMENT = r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<eq>=|:\s*)(?P<value>[^,\s;&]*)"


def is_secret_name(name: object) -> bool:
    """Whether a key or variable name says its value is a credential."""
    text = str(name)
    return bool(re.search(_SECRET_PART, text) or re.search(_SECRET_WORD, text))


def _redact_text(text: str) -> str:
    def hide(m: re.Match) -> str:
        return f"{m['name']}{m['eq']}{REDACTED}" if is_secret_name(m["name"]) and m["value"] else m[0]

    return re.sub(_ASSIGNMENT, hide, text)


@functools.cache
def _short_repr():
    """reprlib's bounded repr (its work stops at a few items and levels, so a value that expands to billions of
    items costs nothing), with mappings in their own order and secrets hidden. Built on the first error."""
    import reprlib

    class ShortRepr(reprlib.Repr):
        def __init__(self):
            super().__init__()
            self.maxlevel, self.maxdict, self.maxlist, self.maxtuple, self.maxset = 3, 6, 8, 8, 8
            self.maxstring, self.maxother, self.maxlong = SHOWN_CHARS, SHOWN_CHARS, 40

        def repr_str(self, x, level):
            return super().repr_str(_redact_text(x[: 64 * SHOWN_CHARS]), level)

        def repr_int(self, x, level):
            if x.bit_length() > 4 * self.maxlong:  # str() of a huge int is slow, and refused past 4300 digits
                return f"<a {x.bit_length()}-bit integer>"
            return super().repr_int(x, level)

        def repr_dict(self, x, level):
            if not x:
                return "{}"
            if level <= 0:
                return "{...}"
            pieces = []
            for i, (k, v) in enumerate(x.items()):
                if i == self.maxdict:
                    pieces.append("...")
                    break
                value = REDACTED if is_secret_name(k) else self.repr1(v, level - 1)
                pieces.append(f"{self.repr1(k, level - 1)}: {value}")
            return "{" + ", ".join(pieces) + "}"

    return ShortRepr()


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str) -> str:
    """An error as printed: one line of at most MAX_LINE_CHARS, its head and its end (the fix) kept."""
    text = text.replace("\n", " ").strip()
    if len(text) <= MAX_LINE_CHARS:
        return text
    half = MAX_LINE_CHARS // 2
    return f"{text[:half]} … {text[-half:]}"


def shown(value: object, key: object = "") -> str:
    """``value`` as an error shows it: its repr, secrets redacted (by ``key``'s name or NAME=value inside it), at
    most SHOWN_CHARS characters, in time and memory bounded however large the value is."""
    last = re.split(r"[\s.\[\]]+", str(key).strip(" .[]"))[-1] if key else ""
    if last and is_secret_name(last):
        return REDACTED
    return shorten(_short_repr().repr(value))


class HpcError(Exception):
    """A mistake in what the user gave us. ``str()`` is the whole one-line message."""

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None):
        self.where = where
        self.fix = fix
        self.problem = message.replace("\n", "\\n")  # without where and fix: for an error naming its own key
        parts = [f"{where}: " if where else "", message]
        if fix:
            parts.append(f"; fix: {fix}")
        super().__init__("".join(parts).replace("\n", "\\n"))


class ConfigError(HpcError):
    """A profile, job file, environment variable or flag holds a value we cannot use."""

    def __init__(self, source: str, key: str, value: object, problem: str, fix: str | None = None):
        self.source, self.key, self.value = source, key, value
        value_part = "" if value is MISSING else f" = {shown(value, key)}"
        super().__init__(f"{shorten(str(key))}{value_part}: {problem}", where=source, fix=fix)


class _Missing:
    """Stands for a key that was not given at all (so the message shows no value)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()
