"""Grade prediction/gold pairs from a JSONL file, so anyone can audit the grader.

    python -m evaluation.grade --input pairs.jsonl [--output out.jsonl] [--timeout 5] [--workers N]

Each input line is ``{"gold": ..., "pred": ...}`` (``pred`` may be a whole completion; other
fields are kept). Each output line is the input object plus ``correct``, ``extracted`` and
``timed_out``. A summary (pairs, correct, accuracy, timeouts, time) goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from dataset.formats import iter_rows

from .grader import GradeOptions, grade_many


@dataclasses.dataclass
class GradeConfig:
    input: Path
    output: Path | None
    timeout: float
    workers: int | None
    no_symbolic: bool


def parse_args(argv: list[str] | None = None) -> GradeConfig:
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.grade",
        allow_abbrev=False, description="Grade {gold, pred} JSONL pairs with the math grader.")
    parser.add_argument("--input", type=Path, required=True, help="JSONL file, one {\"gold\", \"pred\"} object per line")
    parser.add_argument("--output", type=Path, default=None,
                        help="where to write graded lines (default: stdout)")
    parser.add_argument("--timeout", type=float, default=5.0, help="per-pair time limit in seconds")
    parser.add_argument("--workers", type=int, default=None, help="grader processes (default: all cores)")
    parser.add_argument("--no-symbolic", action="store_true", help="skip the sympy/latex2sympy2 step")
    args = parser.parse_args(argv)
    return GradeConfig(args.input, args.output, args.timeout, args.workers, args.no_symbolic)


def read_pairs(path: Path) -> list[dict]:
    """Read and check the input; a bad line raises ``ValueError`` naming file and line."""
    rows = []
    for lineno, row in iter_rows(path):
        if not isinstance(row, dict) or "gold" not in row or "pred" not in row:
            raise ValueError(f"{path}:{lineno}: expected an object with \"gold\" and \"pred\" keys")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        rows = read_pairs(config.input)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = time.monotonic()
    options = GradeOptions(symbolic=not config.no_symbolic)
    results = grade_many(rows, timeout=config.timeout, workers=config.workers, options=options,
                         progress=sys.stderr.isatty())
    out = open(config.output, "w", encoding="utf-8") if config.output else sys.stdout
    try:
        for row, result in zip(rows, results):
            row = dict(row, correct=result.correct, extracted=result.extracted, timed_out=result.timed_out)
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    n = len(rows)
    correct = sum(r.correct for r in results)
    timeouts = sum(r.timed_out for r in results)
    elapsed = time.monotonic() - start
    print(f"graded {n} pairs: {correct} correct ({100.0 * correct / max(n, 1):.1f}%), "
          f"{timeouts} timed out, {elapsed:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
