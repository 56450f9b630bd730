"""SLURM hostlists: ``node[001-004,7],gpu-a[1-2]`` <-> a list of host names.

Expansion follows ``scontrol show hostnames``: bracket groups expand in order, zero padding is kept,
several groups in one name form their product. Compression groups hosts by prefix/suffix/width.
"""

from __future__ import annotations

import re
from itertools import product

from hpc.errors import HpcError, shown

MAX_HOSTS = 100_000  # far above any SLURM cluster; a typo like node[1-99999999] must fail fast, not eat memory
_MAX_DIGITS = 18  # a host number wider than this is a typo (and int() of thousands of digits is refused)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HpcError(f"hostlist {shown(text)}: nested '['", fix="write ranges like node[1-4,7]")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HpcError(f"hostlist {shown(text)}: ']' without '['", fix="balance the brackets")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HpcError(f"hostlist {shown(text)}: '[' without ']'", fix="balance the brackets")
    parts.append(text[start:])
    return parts


def _parse_ranges(spec: str, whole: str) -> list[tuple[int, int, int]]:
    """``"1-4,07"`` -> [(lo, hi, zero-padded width)], nothing expanded yet."""
    out = []
    for item in spec.split(","):
        m = re.fullmatch(rf"(\d{{1,{_MAX_DIGITS}}})(?:-(\d{{1,{_MAX_DIGITS}}}))?", item.strip())
        if not m:
            raise HpcError(f"hostlist {shown(whole)}: bad range {shown(item)}", fix="use digits like 1-4 or 007")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise HpcError(f"hostlist {shown(whole)}: range {shown(item)} runs backwards", fix=f"write {hi_s}-{lo_s}")
        width = len(lo_s) if lo_s.startswith("0") or len(lo_s) == len(hi_s) else 0
        out.append((lo, hi, width))
    return out


def _too_many(hostlist: str) -> HpcError:
    return HpcError(f"hostlist {shown(hostlist)}: more than {MAX_HOSTS} hosts", fix="check the ranges")


def expand(hostlist: str) -> list[str]:
    """``"node[1-3],login"`` -> ``["node1", "node2", "node3", "login"]``.

    The hosts a part names are counted (ranges multiplied) before any is built, so ``n[0-999999][0-999999]`` is
    refused at once."""
    text = hostlist.strip()
    if not text:
        return []
    if any(c.isspace() for c in text):
        raise HpcError(f"hostlist {shown(hostlist)}: contains whitespace", fix="separate hosts with commas only")
    parts = _split_top_level(text)
    if len(parts) > MAX_HOSTS:
        raise _too_many(hostlist)
    hosts: list[str] = []
    for part in parts:
        if not part:
            raise HpcError(f"hostlist {shown(hostlist)}: empty host name", fix="remove the doubled or trailing comma")
        pieces = re.split(r"\[([^\]]*)\]", part)
        if len(pieces) > 1 and pieces[-1]:
            raise HpcError(f"hostlist {shown(hostlist)}: text after the last ']' in {shown(part)}",
                           fix="SLURM allows no suffix after a range; list such hosts one by one")
        if not re.fullmatch(r"[A-Za-z0-9._-]+", "".join(pieces[::2]) or "x"):
            raise HpcError(f"hostlist {shown(hostlist)}: bad character in {shown(part)}",
                           fix="host names hold letters, digits, '.', '_' and '-'")
        # pieces alternates literal, range, literal, range, ..., literal
        groups = [_parse_ranges(p, hostlist) for p in pieces[1::2]]
        count = 1
        for ranges in groups:
            count *= sum(hi - lo + 1 for lo, hi, _ in ranges)
            if len(hosts) + count > MAX_HOSTS:
                raise _too_many(hostlist)
        choices = [[p] if i % 2 == 0 else _numbers(groups[i // 2]) for i, p in enumerate(pieces)]
        hosts.extend("".join(combo) for combo in product(*choices))
    return hosts


def _numbers(ranges: list[tuple[int, int, int]]) -> list[str]:
    return [str(n).zfill(width) for lo, hi, width in ranges for n in range(lo, hi + 1)]


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
