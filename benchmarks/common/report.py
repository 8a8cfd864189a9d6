"""How a benchmark reports: min / median / max of its repeats (``spread``) and its result as
one JSON line, also written to ``--json`` (``emit``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def spread(values: list[float], digits: int = 4) -> dict:
    """min / median / max, to ``digits`` significant digits."""
    sig = lambda x: float(f"{x:.{digits}g}")  # noqa: E731
    return {"min": sig(min(values)), "median": sig(statistics.median(values)),
            "max": sig(max(values))}


def emit(result: dict, json_path: str | None) -> dict:
    """The result as one JSON line on stdout, and indented in ``--json`` when given."""
    print(json.dumps(result))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
    return result
