"""Recognising composite answers: matrices, sets, tuples/intervals, unions and bare lists."""

from __future__ import annotations

import dataclasses
import re

_OPEN = "([{"
_CLOSE = ")]}"
_MATRIX_RE = re.compile(
    r"^\\begin\{(pmatrix|bmatrix|Bmatrix|vmatrix|matrix|smallmatrix|array)\}(\{[^{}]*\})?(.*)"
    r"\\end\{\1\}$", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Composite:
    """A composite answer.

    ``kind`` is one of ``matrix`` (``rows``), ``set`` (``\\{...\\}``, order-free), ``bracket``
    (``(a,b)``/``[a,b)``..., ordered, with ``open``/``close`` characters), ``union`` (intervals
    joined by ``\\cup``, order-free) or ``list`` (bare ``a, b``, order-free).
    """

    kind: str
    items: tuple = ()
    rows: tuple = ()
    open: str = ""
    close: str = ""


def split_top_level(s: str, sep: str = ",") -> list[str]:
    """Split ``s`` on ``sep`` where it is not nested in any bracket (``\\{``/``\\}`` included)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        ch = s[i]
        if s.startswith("\\{", i) or s.startswith("\\}", i):
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return [p.strip() for p in parts]


def _outer_group_closes_at_end(s: str) -> bool:
    """Whether the first character's bracket is closed only by the last character."""
    depth = 0
    for i, ch in enumerate(s):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth == 0 and i != len(s) - 1:
                return False
    return depth == 0


def parse_matrix(s: str) -> tuple[tuple[str, ...], ...] | None:
    m = _MATRIX_RE.match(s.strip())
    if not m:
        return None
    body = m.group(3).strip()
    rows = [r.strip() for r in re.split(r"\\\\", body)]
    rows = [r for r in rows if r and r != "\\hline"]
    grid = tuple(tuple(c.strip() for c in r.split("&")) for r in rows)
    if not grid or len({len(r) for r in grid}) != 1:
        return None
    return grid


def parse_composite(s: str) -> Composite | None:
    """The composite structure of a normalised answer, or None for a single value."""
    s = s.strip()
    grid = parse_matrix(s)
    if grid is not None:
        return Composite("matrix", rows=grid)
    if s.startswith("\\{") and s.endswith("\\}"):
        inner = s[2:-2].strip()
        if split_top_level(inner, ",") and "|" not in inner and ":" not in inner:
            items = tuple(p for p in split_top_level(inner, ",") if p)
            return Composite("set", items=items)
        return None
    union = split_top_level(s, "\\cup")
    if len(union) > 1:
        return Composite("union", items=tuple(union))
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _outer_group_closes_at_end(s):
        items = split_top_level(s[1:-1], ",")
        if len(items) > 1:
            return Composite("bracket", items=tuple(items), open=s[0], close=s[-1])
    items = split_top_level(s, ",")
    if len(items) > 1:
        return Composite("list", items=tuple(p for p in items if p))
    return None
