"""Symbolic equality through sympy (plain expressions) and latex2sympy2 (LaTeX).

Parsing never evaluates huge powers eagerly, and :func:`is_safe` refuses expressions whose
evaluation would explode (``2003^{2002^{2001}}``), so the in-process path stays fast. The worker
pool (``pool.py``) is what *guarantees* a bound on time for anything the guard misses.
"""

from __future__ import annotations

import math
import re
import warnings

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    standard_transformations,
)

_TRANSFORMS = standard_transformations + (implicit_multiplication_application, convert_xor)
MAX_DIGITS = 20_000  # largest integer (in decimal digits) we let sympy materialise
MAX_LENGTH = 400  # longer answers are compared as strings only


def _latex2sympy(s: str):
    try:
        from latex2sympy2 import latex2sympy  # imported lazily: antlr start-up costs ~0.4 s
    except ImportError:
        # Without latex2sympy2 LaTeX answers still match by the cheaper rules (normalised
        # strings, numbers, structures); only symbolic LaTeX equivalence is lost.
        warnings.warn("latex2sympy2 is not installed: LaTeX answers are not compared "
                      "symbolically", RuntimeWarning, stacklevel=2)
        return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return latex2sympy(s)


def to_sympy(s: str):
    """``s`` as a sympy expression, or None. LaTeX goes through latex2sympy2, plain text
    (``sqrt(2)/2``, ``x**2``, ``2x+1``) through ``parse_expr`` without evaluation."""
    s = s.strip()
    if not s or len(s) > MAX_LENGTH or "=" in s:
        return None
    parsers = (_latex_parse, _plain_parse) if ("\\" in s or "{" in s) else (_plain_parse, _latex_parse)
    for parser in parsers:
        try:
            expr = parser(s)
        except Exception:  # noqa: BLE001 - any parser failure means "not this parser"
            continue
        if isinstance(expr, sympy.Basic) and not isinstance(expr, (sympy.logic.boolalg.BooleanAtom,)):
            # a lone `i` in a final answer is the imaginary unit (6+9i, e^{i\pi})
            return expr.xreplace({sympy.Symbol("i"): sympy.I}) if expr.has(sympy.Symbol("i")) else expr
    return None


def _latex_parse(s: str):
    return _latex2sympy(s)


def _plain_parse(s: str):
    if re.search(r"[^\w\s+\-*/^().,!]", s) or "," in s:
        raise ValueError("not a plain expression")
    with sympy.evaluate(False):
        return parse_expr(s, transformations=_TRANSFORMS, evaluate=False)


def _log10_bound(expr) -> float:
    """An upper bound on log10 of the magnitude of numeric subterms (inf when unknown and huge)."""
    if isinstance(expr, sympy.Integer):
        return math.log10(abs(int(expr)) + 1) if abs(int(expr)) < 10 ** 50 else len(str(abs(int(expr))))
    if isinstance(expr, sympy.Rational):
        return max(_log10_bound(sympy.Integer(expr.p)), _log10_bound(sympy.Integer(expr.q)))
    if isinstance(expr, sympy.Float) or expr.is_Atom:
        return 1.0
    if isinstance(expr, sympy.Pow):
        base, exp = expr.args
        exp_digits = _log10_bound(exp)
        if exp_digits > 7:
            return math.inf
        base_digits = max(_log10_bound(base), 1.0)
        return base_digits * (10 ** exp_digits)
    if isinstance(expr, sympy.factorial):
        arg = _log10_bound(expr.args[0])
        return math.inf if arg > 5 else (10 ** arg) * arg
    return sum(_log10_bound(a) for a in expr.args) + 1


def is_safe(expr) -> bool:
    """Whether simplifying/evaluating ``expr`` stays within :data:`MAX_DIGITS`."""
    try:
        return _log10_bound(expr) <= MAX_DIGITS
    except (TypeError, ValueError, OverflowError, RecursionError):
        return False


def symbolic_equal(a, b, rel_tol: float = 1e-4, guard: bool = True) -> bool:
    """Whether sympy expressions ``a`` and ``b`` are equal (exactly, after simplification, or
    numerically within ``rel_tol`` when both are constants)."""
    if guard and not (is_safe(a) and is_safe(b)):
        return False
    try:
        if a == b:
            return True
        if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
            if not (isinstance(a, sympy.MatrixBase) and isinstance(b, sympy.MatrixBase)):
                return False
            if a.shape != b.shape:
                return False
            return all(symbolic_equal(x, y, rel_tol, guard) for x, y in zip(a, b))
        if a.has(sympy.oo, -sympy.oo, sympy.zoo) or b.has(sympy.oo, -sympy.oo, sympy.zoo):
            return sympy.simplify(a) == sympy.simplify(b)
        diff = a - b
        if diff == 0:
            return True
        if a.is_rational and b.is_rational:  # exact values (incl. unevaluated 2^{20}): no tolerance
            return sympy.simplify(diff) == 0
        if a.is_number and b.is_number:
            value = complex(sympy.N(diff, 30))
            scale = max(abs(complex(sympy.N(b, 30))), 1e-12)
            return abs(value) <= rel_tol * scale or abs(value) < 1e-12
        if sympy.expand(diff) == 0:
            return True
        return sympy.simplify(diff) == 0
    except Exception:  # noqa: BLE001 - sympy raises many types on odd input
        return False


def proportional(a, b, guard: bool = True) -> bool:
    """Whether ``a = k * b`` for a nonzero constant ``k`` (used for equations ``lhs - rhs``)."""
    if guard and not (is_safe(a) and is_safe(b)):
        return False
    try:
        if sympy.simplify(a - b) == 0 or sympy.simplify(a + b) == 0:
            return True
        if b == 0:
            return False
        ratio = sympy.simplify(a / b)
        return bool(ratio.is_number and ratio != 0 and ratio.is_finite)
    except Exception:  # noqa: BLE001
        return False
