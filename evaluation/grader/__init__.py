"""Answer extraction and grading: the one home for both (the trainer's rewards, the benchmark
loaders and the training-data importers all call it).

    from evaluation.grader import extract_answer, grade, grade_many
    extract_answer("... so the answer is \\\\boxed{\\\\frac{1}{2}}.")  # -> "\\\\frac{1}{2}"
    grade("... \\\\boxed{0.5}", "\\\\frac12")                          # -> True (in-process)
    grade_many([(completion, gold), ...], timeout=5, workers=8)      # worker processes

``grade`` is the fast in-process path; ``grade_many`` runs every pair in worker processes with
a hard per-item timeout, so no input can hang the caller. Names load on first use: the symbolic
checks import sympy (a second or more), which ``last_boxed`` and the task scorers never need.
"""

from __future__ import annotations

import importlib

# ``normalize`` names a function and its module: imported here (it is cheap: ``re`` only), the
# function is bound after the module, so a later ``import evaluation.grader.normalize`` cannot
# leave the module where the function should be
from .normalize import normalize

# public name -> its module here
_EXPORTS = {
    **dict.fromkeys(("GradeOptions", "answers_equal", "gold_answer", "grade", "prediction_answer"),
                    "equivalence"),
    **dict.fromkeys(("boxed_contents", "extract_answer", "final_boxed", "gsm8k_answer",
                     "last_boxed"), "extract"),
    **dict.fromkeys(("GraderPool", "GradeResult", "grade_many", "grade_one"), "pool"),
    **dict.fromkeys(("chain_equations", "chain_spec", "check_countdown", "countdown_spec",
                     "exact_number", "math_gold", "score_arithmetic", "score_chain",
                     "score_countdown", "score_countdown_r1", "score_gsm8k"), "tasks"),
}

__all__ = sorted([*_EXPORTS, "normalize"])


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
