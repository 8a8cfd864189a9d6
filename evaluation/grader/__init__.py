"""Answer extraction and grading: the one home for both (the trainer's rewards, the benchmark
loaders and the training-data importers all call it).

    from evaluation.grader import extract_answer, grade, grade_many
    extract_answer("... so the answer is \\\\boxed{\\\\frac{1}{2}}.")  # -> "\\\\frac{1}{2}"
    grade("... \\\\boxed{0.5}", "\\\\frac12")                          # -> True (in-process)
    grade_many([(completion, gold), ...], timeout=5, workers=8)      # worker processes

``grade`` is the fast in-process path; ``grade_many`` runs every pair in worker processes with
a hard per-item timeout, so no input can hang the caller.
"""

from .equivalence import GradeOptions, answers_equal, gold_answer, grade, prediction_answer
from .extract import boxed_contents, extract_answer, final_boxed, gsm8k_answer, last_boxed
from .normalize import normalize
from .pool import GraderPool, GradeResult, grade_many, grade_one
from .tasks import (chain_equations, chain_spec, check_countdown, countdown_spec, exact_number,
                    math_gold, score_arithmetic, score_chain, score_countdown, score_countdown_r1,
                    score_gsm8k)

__all__ = [
    "GradeOptions", "GradeResult", "GraderPool", "answers_equal", "boxed_contents", "chain_equations",
    "chain_spec", "check_countdown", "countdown_spec", "exact_number", "extract_answer", "final_boxed",
    "gold_answer", "grade", "grade_many", "grade_one", "gsm8k_answer", "last_boxed", "math_gold",
    "normalize", "prediction_answer", "score_arithmetic", "score_chain", "score_countdown",
    "score_countdown_r1", "score_gsm8k",
]
