"""The math answer grader (also the trainer's ``math`` reward).

    from evaluation.grader import extract_answer, grade, grade_many
    extract_answer("... so the answer is \\\\boxed{\\\\frac{1}{2}}.")  # -> "\\\\frac{1}{2}"
    grade("... \\\\boxed{0.5}", "\\\\frac12")                          # -> True (in-process)
    grade_many([(completion, gold), ...], timeout=5, workers=8)      # worker processes

``grade`` is the fast in-process path; ``grade_many`` runs every pair in worker processes with
a hard per-item timeout, so no input can hang the caller.
"""

from .equivalence import GradeOptions, answers_equal, gold_answer, grade, prediction_answer
from .extract import boxed_contents, extract_answer, last_boxed
from .normalize import normalize
from .pool import GraderPool, GradeResult, grade_many, grade_one

__all__ = [
    "GradeOptions", "GradeResult", "GraderPool", "answers_equal", "boxed_contents",
    "extract_answer", "gold_answer", "grade", "grade_many", "grade_one", "last_boxed",
    "normalize", "prediction_answer",
]
