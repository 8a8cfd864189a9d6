"""Where in a ``chain`` answer the errors fall: each held-out answer marked step by step, as
``evaluation.grader.score_chain`` marks it, so the report can show accuracy by position in the
answer (steps 1-5, 6-10, ...) and the first wrong step. Compression evicts the middle of a long
answer, so a compressed policy that loses the running total shows its errors late; one that
writes wrong sums from the start shows them early.

A mark string has one character a step: ``1`` right, ``0`` attempted and wrong, ``.`` never
written (the answer stopped, was cut at the length cap, or went off the chain).
"""

from __future__ import annotations

import math

from evaluation.grader.tasks import chain_equations, chain_spec

RIGHT, WRONG, MISSING = "1", "0", "."


def chain_marks(response: str, label) -> str:
    """The steps of ``response`` as ``score_chain`` credits them (its count of ``1`` / N is the score)."""
    total, steps = chain_spec(label)
    marks, i = [], 0
    for a, b, c in chain_equations(response):
        if i == len(steps):
            break
        if a != total:
            continue
        marks.append(RIGHT if b == steps[i] and c == a + b else WRONG)
        total, i = c, i + 1
    return "".join(marks) + MISSING * (len(steps) - i)


def is_chain_label(label) -> bool:
    try:
        chain_spec(label)
    except (ValueError, TypeError, KeyError):
        return False
    return True


def first_wrong(marks: str) -> int:
    """1-based position of the first step not right (``len(marks) + 1`` when all are)."""
    return next((i + 1 for i, m in enumerate(marks) if m != RIGHT), len(marks) + 1)


def bucket_accuracy(marks: list[str], buckets: int = 5) -> list[float]:
    """Share of right steps in each of ``buckets`` equal spans of the answer, over all answers."""
    if not marks:
        return [math.nan] * buckets
    n = len(marks[0])
    edges = [round(k * n / buckets) for k in range(buckets + 1)]
    out = []
    for lo, hi in zip(edges, edges[1:]):
        cells = [m[j] for m in marks for j in range(lo, hi)]
        out.append(sum(c == RIGHT for c in cells) / len(cells) if cells else math.nan)
    return out


def bucket_names(steps: int, buckets: int = 5) -> list[str]:
    edges = [round(k * steps / buckets) for k in range(buckets + 1)]
    return [f"steps {lo + 1}-{hi}" for lo, hi in zip(edges, edges[1:])]
