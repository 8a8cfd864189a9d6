"""Normalisation of an extracted answer string before comparison.

``normalize`` removes presentation-only LaTeX (``\\left``, ``\\!``, ``\\dfrac``, ``$``, degree
signs, ``\\text{}`` wrappers, trailing units, thousands separators...) but keeps anything that
can change the value (percent signs, brackets, ``=``). The result keeps single spaces so LaTeX
such as ``\\pi r`` still parses; ``compact`` removes them for string comparison.
"""

from __future__ import annotations

import re

from .extract import match_brace

_SPACING = [r"\!", r"\,", r"\;", r"\:", r"\quad", r"\qquad", r"\displaystyle", r"\textstyle"]
_SIZE_RE = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg)(?![a-zA-Z])")
_STYLE_RE = re.compile(r"\\(?:mathbf|boldsymbol|bm|mathit|mathsf|textbf|textit|emph|mathnormal)\s*\{")
_TEXT_CMD = r"\\(?:text|mbox|mathrm|textrm|textnormal|operatorname|hbox)"
_TEXT_WHOLE_RE = re.compile(r"^" + _TEXT_CMD + r"\s*\{(.*)\}$", re.DOTALL)
_UNIT_TAIL_RE = re.compile(r"^(.*?\S)\s*" + _TEXT_CMD + r"\s*\{[^{}]*\}\s*(?:\^\s*\{?\s*[23]\s*\}?)?\s*$",
                           re.DOTALL)
_WORD_TAIL_RE = re.compile(r"^(.*?[\d}])\s+([a-zA-Z][a-zA-Z .]*?)(?:\s*\^\s*\{?\s*[23]\s*\}?)?\s*$")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_FRAC_SHORT_RE = re.compile(r"\\frac\s*(\d)\s*(\d)")
_FRAC_HALF_RE = re.compile(r"\\frac\s*(\{[^{}]*\})\s*(\d)")
_FRAC_HALF2_RE = re.compile(r"\\frac\s*(\d)\s*(\{[^{}]*\})")
_SQRT_SHORT_RE = re.compile(r"\\sqrt\s*(\d+|[a-zA-Z])")
_MATH_WORDS = {"pi", "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "sqrt", "and",
               "or", "inf", "infty", "mod", "pmod", "deg"}
_WORD_NUMBERS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
}


def _unwrap_command(s: str, pattern: re.Pattern) -> str:
    """Replace ``\\cmd{X}`` by ``X`` for every match of ``pattern`` (which ends at the ``{``)."""
    while True:
        m = pattern.search(s)
        if not m:
            return s
        end = match_brace(s, m.end() - 1)
        if end is None:
            return s
        s = s[:m.start()] + s[m.end():end] + s[end + 1:]


def strip_math_delimiters(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), (r"\(", r"\)"), (r"\[", r"\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left):len(s) - len(right)].strip()
    return s.replace("$", "")


def strip_units(s: str) -> str:
    """Drop a trailing unit: ``15\\mbox{ cm}^2`` -> ``15``, ``18 dollars`` -> ``18``.

    Only a unit *after* something that ends in a digit or a closing brace is removed, so
    ``\\text{Monday}`` or ``2x`` are left alone.
    """
    for _ in range(3):
        m = _UNIT_TAIL_RE.match(s)
        if m and re.search(r"[\d}]$", m.group(1)):
            s = m.group(1).strip()
            continue
        m = _WORD_TAIL_RE.match(s)
        word = m.group(2).replace(" ", "").replace(".", "").lower() if m else ""
        if m and len(word) >= 2 and word not in _MATH_WORDS:
            s = m.group(1).strip()
            continue
        break
    return s


def normalize(answer: str | None) -> str:
    """A canonical form of an answer string (see the module docstring)."""
    if answer is None:
        return ""
    s = str(answer).replace("\n", " ").strip()
    s = s.replace("\\$", "")
    s = strip_math_delimiters(s)
    s = s.replace("\\%", "%").replace("~", " ")
    s = re.sub(r"(?<!\\)\\ ", " ", s)
    for token in _SPACING:
        s = re.sub(re.escape(token) + r"(?![a-zA-Z])", " ", s)
    s = _SIZE_RE.sub("", s)
    s = _unwrap_command(s, _STYLE_RE)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree", "", s)
    s = re.sub(r"\\(?:infinity|infin)\b", r"\\infty", s)
    s = re.sub(r"\\varnothing|\\emptyset|^\\\{\s*\\\}$", r"\\emptyset", s)
    s = s.strip().rstrip(".").strip()
    whole = _TEXT_WHOLE_RE.match(s)
    if whole and match_brace(s, s.index("{")) == len(s) - 1:
        s = whole.group(1).strip()
    s = strip_units(s)
    s = re.sub(r"\s*\\text\s*\{\s*(and|or)\s*\}\s*", ",", s)
    s = re.sub(r"\s+(?:and|or)\s+", ",", s)
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_RE.sub(r"\\frac\1{\2}", s)
    s = _FRAC_HALF2_RE.sub(r"\\frac{\1}\2", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = re.sub(r"\s+", " ", s).strip()
    if _THOUSANDS_RE.match(s.replace(" ", "")):
        s = s.replace(",", "").replace(" ", "")
    if s.startswith("+"):
        s = s[1:].strip()
    lowered = s.lower()
    if lowered in _WORD_NUMBERS:
        s = _WORD_NUMBERS[lowered]
    if lowered in ("inf", "infinity", "+\\infty"):
        s = "\\infty"
    return s


def compact(s: str) -> str:
    """``s`` without whitespace, for string comparison."""
    return re.sub(r"\s+", "", s)
