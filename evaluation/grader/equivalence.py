"""Answer equivalence: is a predicted answer the same as the gold answer?

Rules, cheapest first (each one is tested in both directions in
``tests/evaluation/test_grader_equivalence.py``):

1. identical after normalisation (case-insensitive; a multiple-choice letter matches ``(B)``);
2. plain numbers: integers exactly, otherwise relative tolerance 1e-4; fractions, decimals,
   mixed numbers, scientific notation; a percent sign on one side accepts both readings, a
   missing one never multiplies by 100 (gold 7 vs prediction 700 is wrong);
3. composites: matrices elementwise; sets, bare lists and unions of intervals order-free;
   tuples and intervals ordered *with matching bracket types* (``[-2,1)`` is not ``(-2,1)``);
4. equations: ``lhs - rhs`` proportional (``y = 2x + 3`` is ``2x - y + 3 = 0``), or a single
   ``x = value`` compared by value against a bare answer;
5. symbolic equality through sympy / latex2sympy2 (``\\sqrt{8}`` is ``2\\sqrt{2}``), with a guard
   against expressions whose evaluation would explode.
"""

from __future__ import annotations

import dataclasses
import re

from .extract import extract_answer, has_anchor, last_boxed
from .normalize import compact, normalize
from .numeric import numbers_equal, parse_number
from .structure import Composite, parse_composite, split_top_level


@dataclasses.dataclass(frozen=True)
class GradeOptions:
    """Knobs of the equivalence check."""

    rel_tol: float = 1e-4  # relative tolerance for non-integer numbers
    symbolic: bool = True  # try sympy / latex2sympy2 when cheaper rules fail
    guard: bool = True  # refuse to evaluate expressions with astronomically large numbers


DEFAULT_OPTIONS = GradeOptions()
_ASSIGN_RE = re.compile(r"^\s*(?:[a-zA-Z](?:_\{?\w+\}?)?|\\[a-zA-Z]+|[a-zA-Z]\([a-zA-Z]\))\s*=(?!=)(.*)$")
_CHOICE_RE = re.compile(r"^\(?([A-Ea-e])\)?$")
_MAX_DEPTH = 4


def strip_assignment(s: str) -> str:
    """``x = 5`` -> ``5``; ``x=1, y=2`` -> ``1, 2``; anything else unchanged."""
    parts = split_top_level(s, ",")
    stripped = []
    for part in parts:
        m = _ASSIGN_RE.match(part)
        if m and "=" not in m.group(1):
            stripped.append(m.group(1).strip())
        else:
            stripped.append(part)
    return ", ".join(stripped) if len(parts) > 1 else stripped[0]


def answers_equal(pred: str | None, gold: str | None, options: GradeOptions = DEFAULT_OPTIONS) -> bool:
    """Whether the extracted answer ``pred`` is equivalent to the gold answer ``gold``."""
    if pred is None or gold is None:
        return False
    p, g = normalize(pred), normalize(gold)
    if not p or not g:
        return False
    return _equal(p, g, options, 0)


def _equal(p: str, g: str, options: GradeOptions, depth: int) -> bool:
    if compact(p).lower() == compact(g).lower():
        return True
    choice_p, choice_g = _CHOICE_RE.match(compact(p)), _CHOICE_RE.match(compact(g))
    if choice_p and choice_g:
        return choice_p.group(1).upper() == choice_g.group(1).upper()
    np_, ng = parse_number(p), parse_number(g)
    if np_ is not None and ng is not None:
        return numbers_equal(np_, ng, options.rel_tol)
    if depth >= _MAX_DEPTH:
        return False

    p_eqs, g_eqs = _top_level_equals(p), _top_level_equals(g)
    if p_eqs == 1 and g_eqs == 1:
        if _equations_equal(p, g, options):
            return True
    sp, sg = strip_assignment(p), strip_assignment(g)
    if (sp, sg) != (p, g) and "=" not in sp and "=" not in sg:
        return _equal(sp, sg, options, depth + 1)
    if "=" in p or "=" in g:
        return False

    cp, cg = parse_composite(p), parse_composite(g)
    if cp is not None or cg is not None:
        return _composites_equal(cp, cg, p, g, options, depth)
    if not options.symbolic:
        return False
    if np_ is None and ng is None and not _could_be_math(p) and not _could_be_math(g):
        return False
    from .symbolic import symbolic_equal, to_sympy  # sympy: loaded by the first symbolic check

    a, b = to_sympy(p), to_sympy(g)
    if a is None or b is None:
        return False
    return symbolic_equal(a, b, options.rel_tol, options.guard)


def _could_be_math(s: str) -> bool:
    return bool(re.search(r"[\d\\^_+\-*/()]", s)) or len(compact(s)) <= 3


def _top_level_equals(s: str) -> int:
    return len(split_top_level(s, "=")) - 1 if "=" in s and not any(op in s for op in ("\\le", "\\ge", "<", ">")) else 0


def _equations_equal(p: str, g: str, options: GradeOptions) -> bool:
    if not options.symbolic:
        return False
    pl, pr = split_top_level(p, "=")
    gl, gr = split_top_level(g, "=")
    if compact(pl) == compact(gl) and _equal(pr, gr, options, _MAX_DEPTH - 1):
        return True
    from .symbolic import proportional, to_sympy

    sides = [to_sympy(x) for x in (pl, pr, gl, gr)]
    if any(x is None for x in sides):
        return False
    try:
        return proportional(sides[0] - sides[1], sides[2] - sides[3], options.guard)
    except Exception:  # noqa: BLE001
        return False


def _elements_equal(ps, gs, options: GradeOptions, depth: int, ordered: bool) -> bool:
    if len(ps) != len(gs):
        return False
    if ordered:
        return all(_equal(a, b, options, depth + 1) for a, b in zip(ps, gs))
    remaining = list(ps)
    for g in gs:
        for i, p in enumerate(remaining):
            if _equal(p, g, options, depth + 1):
                del remaining[i]
                break
        else:
            return False
    return True


def _vector(c: Composite | None) -> tuple | None:
    """A one-row or one-column matrix as a flat tuple."""
    if c is None or c.kind != "matrix":
        return None
    if len(c.rows) == 1:
        return c.rows[0]
    if all(len(r) == 1 for r in c.rows):
        return tuple(r[0] for r in c.rows)
    return None


def _composites_equal(cp, cg, p: str, g: str, options: GradeOptions, depth: int) -> bool:
    if cp is None or cg is None:
        return False
    if cp.kind == "matrix" and cg.kind == "matrix":
        if len(cp.rows) != len(cg.rows) or len(cp.rows[0]) != len(cg.rows[0]):
            return False
        return all(_elements_equal(a, b, options, depth, True) for a, b in zip(cp.rows, cg.rows))
    vp, vg = _vector(cp), _vector(cg)
    if vp is not None and cg.kind == "bracket" and cg.open == "(" and cg.close == ")":
        return _elements_equal(vp, cg.items, options, depth, True)
    if vg is not None and cp.kind == "bracket" and cp.open == "(" and cp.close == ")":
        return _elements_equal(cp.items, vg, options, depth, True)
    if cp.kind == "bracket" and cg.kind == "bracket":
        if (cp.open, cp.close) != (cg.open, cg.close):
            return False
        return _elements_equal(cp.items, cg.items, options, depth, True)
    unordered = {"set", "list", "union"}
    if cp.kind in unordered and cg.kind in unordered:
        if (cp.kind == "union") != (cg.kind == "union"):
            return False
        return _elements_equal(cp.items, cg.items, options, depth, False)
    # a parenthesised tuple written without its parentheses (gold "(3, 4)", pred "3, 4")
    if {cp.kind, cg.kind} == {"bracket", "list"}:
        bracket = cp if cp.kind == "bracket" else cg
        if (bracket.open, bracket.close) == ("(", ")"):
            return _elements_equal(cp.items, cg.items, options, depth, True)
    return False


def prediction_answer(pred_text: str | None) -> str | None:
    """The answer to grade from a prediction that is either a whole completion or a bare answer.

    Text with an explicit anchor (box, "the answer is", ``####``, ``<answer>``) is extracted;
    short text that reads like a bare answer (``\\frac{1}{4}``, ``x = 5``, ``18 dollars``) is
    used whole; anything else falls back to the last number.
    """
    if pred_text is None:
        return None
    text = str(pred_text)
    if has_anchor(text):
        return extract_answer(text)
    if _looks_like_bare_answer(text):
        return text.strip()
    return extract_answer(text)


def _looks_like_bare_answer(text: str) -> bool:
    if "\n" in text.strip() or len(text) > 200:
        return False
    no_commands = re.sub(r"\\(?:text|mbox|mathrm)\s*\{[^{}]*\}|\\(?:begin|end)\{\w+\*?\}|\\[a-zA-Z]+",
                         " ", text)
    words = re.findall(r"[A-Za-z]{3,}", no_commands)
    return len(words) <= 1


def gold_answer(gold) -> str | None:
    """The gold answer as a string; a gold that still holds a ``\\boxed{}`` is unboxed."""
    if gold is None:
        return None
    if isinstance(gold, (list, tuple)):
        gold = gold[0] if gold else None
        if gold is None:
            return None
    gold = str(gold)
    boxed = last_boxed(gold)
    return boxed if boxed is not None else gold


def grade(pred_text_or_answer: str | None, gold, options: GradeOptions = DEFAULT_OPTIONS) -> bool:
    """Whether a prediction (a whole completion or a bare answer) is correct for ``gold``.

    Runs in the calling process. The cheap rules cannot hang; the sympy step is guarded against
    explosive expressions but has no hard time limit: use :func:`evaluation.grader.grade_many`
    (worker processes with a per-item timeout) for untrusted input at scale.
    """
    return answers_equal(prediction_answer(pred_text_or_answer), gold_answer(gold), options)
