"""Reading plain numbers (integers, decimals, fractions, mixed numbers, scientific notation,
percentages) out of a normalised answer, exactly where possible."""

from __future__ import annotations

import dataclasses
import math
import re
from fractions import Fraction

_INT = r"[+-]?\d+"
_DEC = r"[+-]?(?:\d+\.\d*|\.\d+|\d+)"
_INT_RE = re.compile(rf"^{_INT}$")
_DEC_RE = re.compile(rf"^{_DEC}$")
_SLASH_RE = re.compile(rf"^({_DEC})/({_DEC})$")
_FRAC_RE = re.compile(rf"^([+-]?)\\frac\{{({_DEC})\}}\{{({_DEC})\}}$")
_MIXED_RE = re.compile(r"^([+-]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$")
_SCI_E_RE = re.compile(rf"^({_DEC})[eE]({_INT})$")
_SCI_TIMES_RE = re.compile(rf"^({_DEC})(?:\\times|\\cdot|\*|x)10\^(?:\{{({_INT})\}}|({_INT}))$")
_POW10_RE = re.compile(rf"^10\^(?:\{{({_INT})\}}|({_INT}))$")


@dataclasses.dataclass(frozen=True)
class Number:
    """A parsed number: exact value, whether it was written as an integer, and whether it had
    a percent sign (``value`` is then already divided by 100)."""

    value: Fraction
    integer_literal: bool
    percent: bool


def parse_number(s: str) -> Number | None:
    """``s`` (already normalised, any spaces) as a :class:`Number`, or None if it is not one."""
    s = re.sub(r"\s+", "", s)
    percent = s.endswith("%")
    if percent:
        s = s[:-1]
    value, integer = _parse_plain(s)
    if value is None:
        return None
    if percent:
        value = value / 100
    return Number(value, integer and not percent, percent)


def _parse_plain(s: str) -> tuple[Fraction | None, bool]:
    if not s or len(s) > 60:
        return None, False
    try:
        if _INT_RE.match(s):
            return Fraction(int(s)), True
        if _DEC_RE.match(s):
            return Fraction(s), False
        m = _SLASH_RE.match(s)
        if m and Fraction(m.group(2)) != 0:
            return Fraction(m.group(1)) / Fraction(m.group(2)), False
        m = _FRAC_RE.match(s)
        if m and Fraction(m.group(3)) != 0:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return (-value if m.group(1) == "-" else value), False
        m = _MIXED_RE.match(s)
        if m and 0 < int(m.group(3)) < int(m.group(4)):
            value = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
            return (-value if m.group(1) == "-" else value), False
        m = _SCI_E_RE.match(s)
        if m and abs(int(m.group(2))) <= 300:
            return Fraction(m.group(1)) * Fraction(10) ** int(m.group(2)), False
        m = _SCI_TIMES_RE.match(s)
        if m:
            exponent = int(m.group(2) or m.group(3))
            if abs(exponent) <= 300:
                return Fraction(m.group(1)) * Fraction(10) ** exponent, False
        m = _POW10_RE.match(s)
        if m:
            exponent = int(m.group(1) or m.group(2))
            if abs(exponent) <= 300:
                return Fraction(10) ** exponent, exponent >= 0
    except (ValueError, ZeroDivisionError):
        return None, False
    return None, False


def close(a: float, b: float, rel_tol: float = 1e-4, abs_tol: float = 1e-9) -> bool:
    """Relative closeness (the reference's 1e-4), with a tiny absolute floor near zero."""
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


def numbers_equal(pred: Number, gold: Number, rel_tol: float = 1e-4) -> bool:
    """Equality of two parsed numbers.

    Two integers must match exactly (so ``1000001`` is not ``1000000``); otherwise values agree
    within ``rel_tol``. A percent sign on either side also accepts the number without its
    sign (``50%`` matches ``0.5`` and ``50``), but a plain ``700`` never matches ``7``: the
    reference's blanket x100 / /100 rule is the false positive we do not repeat.
    """
    if pred.integer_literal and gold.integer_literal:
        return pred.value == gold.value
    candidates_pred = [pred.value] + ([pred.value * 100] if pred.percent else [])
    candidates_gold = [gold.value] + ([gold.value * 100] if gold.percent else [])
    for p in candidates_pred:
        for g in candidates_gold:
            if p == g or close(float(p), float(g), rel_tol):
                return True
    return False
