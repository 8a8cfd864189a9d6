"""Check ``prompt``/``label`` data files; every bad row (a line that is not JSON too) is reported
as ``FILE:LINE: problem``, up to ``--max-errors`` per file, then how many more there are.

    python -m dataset.validate data/train.jsonl [more.jsonl ...] [--max-errors 20]

Exit status 0 when every file is valid, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from .formats import iter_checked_rows, row_problem


@dataclasses.dataclass
class Report:
    path: Path
    rows: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)  # the first max_errors
    bad_rows: int = 0  # all of them
    string_prompts: int = 0
    chat_prompts: int = 0


def validate_file(path: str | Path, max_errors: int = 20, allow_empty_label: bool = False) -> Report:
    """Validate one file; ``errors`` holds up to ``max_errors`` messages ``FILE:LINE: problem``,
    ``bad_rows`` counts every bad row."""
    path = Path(path)
    report = Report(path)
    if not path.is_file():
        report.errors.append(f"{path}: no such file")
        return report
    try:
        for lineno, row, problem in iter_checked_rows(path):
            report.rows += 1
            problem = problem or row_problem(row, allow_empty_label)
            if problem:
                report.bad_rows += 1
                if len(report.errors) < max_errors:
                    report.errors.append(f"{path}:{lineno}: {problem}")
                continue
            if isinstance(row["prompt"], str):
                report.string_prompts += 1
            else:
                report.chat_prompts += 1
    except (ValueError, RuntimeError) as exc:
        report.errors.append(str(exc))
    if report.rows == 0 and not report.errors:
        report.errors.append(f"{path}: no rows")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataset.validate",
                                     description="Validate prompt/label JSONL or parquet files.")
    parser.add_argument("files", nargs="+", type=Path, help="files to check")
    parser.add_argument("--max-errors", type=int, default=20, help="errors reported per file (default 20)")
    parser.add_argument("--allow-empty-labels", action="store_true",
                        help="accept rows whose label is an empty string (they can never be rewarded)")
    args = parser.parse_args(argv)
    if args.max_errors < 1:
        parser.error(f"--max-errors {args.max_errors}: must be at least 1")
    ok = True
    for path in args.files:
        report = validate_file(path, args.max_errors, args.allow_empty_labels)
        for error in report.errors:
            print(error, file=sys.stderr)
        unlisted = report.bad_rows - len(report.errors)
        if unlisted > 0:
            print(f"{path}: {unlisted} more bad row(s) not listed (--max-errors {args.max_errors})",
                  file=sys.stderr)
        status = "ok" if not report.errors else f"{max(report.bad_rows, len(report.errors))} error(s)"
        print(f"{path}: {report.rows} rows ({report.string_prompts} string prompts, "
              f"{report.chat_prompts} chat prompts): {status}")
        ok = ok and not report.errors
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
