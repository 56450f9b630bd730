"""SLURM hostlists: ``node[001-004,7],gpu-a[1-2]`` <-> a list of host names.

Expansion follows ``scontrol show hostnames``: bracket groups expand in order, zero padding is kept,
several groups in one name form their product. Compression groups hosts by prefix/suffix/width.
"""

from __future__ import annotations

import re
from itertools import product

from hpc.errors import HpcError

_MAX_HOSTS = 1_000_000  # a typo like node[1-99999999] must fail fast, not eat memory


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HpcError(f"hostlist {text!r}: nested '['", fix="write ranges like node[1-4,7]")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HpcError(f"hostlist {text!r}: ']' without '['", fix="balance the brackets")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HpcError(f"hostlist {text!r}: '[' without ']'", fix="balance the brackets")
    parts.append(text[start:])
    return parts


def _expand_range(spec: str, whole: str) -> list[str]:
    out: list[str] = []
    for item in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if not m:
            raise HpcError(f"hostlist {whole!r}: bad range {item!r}", fix="use digits like 1-4 or 007")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise HpcError(f"hostlist {whole!r}: range {item!r} runs backwards", fix=f"write {hi_s}-{lo_s}")
        if hi - lo >= _MAX_HOSTS:
            raise HpcError(f"hostlist {whole!r}: range {item!r} is too large", fix="check the numbers")
        width = len(lo_s) if lo_s.startswith("0") or len(lo_s) == len(hi_s) else 0
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def expand(hostlist: str) -> list[str]:
    """``"node[1-3],login"`` -> ``["node1", "node2", "node3", "login"]``."""
    text = hostlist.strip()
    if not text:
        return []
    if any(c.isspace() for c in text):
        raise HpcError(f"hostlist {hostlist!r}: contains whitespace", fix="separate hosts with commas only")
    hosts: list[str] = []
    for part in _split_top_level(text):
        if not part:
            raise HpcError(f"hostlist {hostlist!r}: empty host name", fix="remove the doubled or trailing comma")
        pieces = re.split(r"\[([^\]]*)\]", part)
        if len(pieces) > 1 and pieces[-1]:
            raise HpcError(f"hostlist {hostlist!r}: text after the last ']' in {part!r}",
                           fix="SLURM allows no suffix after a range; list such hosts one by one")
        # pieces alternates literal, range, literal, range, ..., literal
        choices = [[p] if i % 2 == 0 else _expand_range(p, hostlist) for i, p in enumerate(pieces)]
        if not re.fullmatch(r"[A-Za-z0-9._-]+", "".join(pieces[::2]) or "x"):
            raise HpcError(f"hostlist {hostlist!r}: bad character in {part!r}",
                           fix="host names hold letters, digits, '.', '_' and '-'")
        hosts.extend("".join(combo) for combo in product(*choices))
        if len(hosts) > _MAX_HOSTS:
            raise HpcError(f"hostlist {hostlist!r}: more than {_MAX_HOSTS} hosts", fix="check the ranges")
    return hosts


_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")


def compress(hosts: list[str] | tuple[str, ...]) -> str:
    """The shortest usual spelling of a set of hosts; duplicates are dropped, like SLURM does."""
    groups: dict[tuple[str, str, int], set[int]] = {}
    plain: set[str] = set()
    order: list[tuple] = []
    for h in dict.fromkeys(hosts):
        m = _NUMBERED.match(h)
        if not m:
            plain.add(h)
            continue
        prefix, digits, suffix = m.groups()
        if suffix:  # SLURM has no spelling for a range followed by a suffix
            plain.add(h)
            continue
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, suffix, width)
        if key not in groups:
            groups[key] = set()
            order.append(key)
        groups[key].add(int(digits))
    out = sorted(plain)
    for key in sorted(order):
        prefix, suffix, width = key
        nums = sorted(groups[key])
        ranges: list[str] = []
        start = prev = nums[0]
        for n in nums[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            lo, hi = str(start).zfill(width), str(prev).zfill(width)
            ranges.append(lo if start == prev else f"{lo}-{hi}")
            if n is not None:
                start = prev = n
        if len(nums) == 1:
            out.append(f"{prefix}{ranges[0]}{suffix}")
        else:
            out.append(f"{prefix}[{','.join(ranges)}]{suffix}")
    return ",".join(out)
