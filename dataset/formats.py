"""Reading and writing ``prompt``/``label`` data files (JSONL, or parquet when pyarrow is there).

A row is ``{"prompt": <str or list of chat messages>, "label": <str>}`` plus optional extra
fields; a chat message is ``{"role": "system"|"user"|"assistant", "content": <str>}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

ROLES = ("system", "user", "assistant")


def _require_pyarrow(path: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise RuntimeError(f"{path}: reading/writing parquet needs pyarrow (pip install pyarrow); "
                           f"JSONL needs nothing") from None
    return pq


def iter_rows(path: str | Path) -> Iterator[tuple[int, object]]:
    """``(line_number, row)`` for each row; a line that is not JSON raises ``ValueError`` naming
    file and line. Parquet rows are numbered from 1."""
    for lineno, row, problem in iter_checked_rows(path):
        if problem:
            raise ValueError(f"{path}:{lineno}: {problem}")
        yield lineno, row


def iter_checked_rows(path: str | Path) -> Iterator[tuple[int, object, str | None]]:
    """``(line_number, row, None)`` for each row, ``(line_number, None, problem)`` for a line that
    is not JSON: every line is read, a bad one does not end the file."""
    path = Path(path)
    if path.suffix == ".parquet":
        pq = _require_pyarrow(path)
        for i, row in enumerate(pq.read_table(path).to_pylist(), 1):
            yield i, row, None
        return
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line), None
            except json.JSONDecodeError as exc:
                yield lineno, None, f"not valid JSON ({exc.msg})"


def write_rows(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows as JSONL (or parquet by suffix); returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    if path.suffix == ".parquet":
        pq = _require_pyarrow(path)
        import pyarrow as pa

        pq.write_table(pa.Table.from_pylist(rows), path)
        return len(rows)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(rows)


def row_problem(row, allow_empty_label: bool = False) -> str | None:
    """What is wrong with a ``prompt``/``label`` row, or None when it is valid."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    if "prompt" not in row:
        return "missing 'prompt'"
    if "label" not in row:
        return "missing 'label'"
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():
            return "'prompt' is empty"
    elif isinstance(prompt, list):
        if not prompt:
            return "'prompt' is an empty message list"
        for i, message in enumerate(prompt):
            if not isinstance(message, dict) or set(message) - {"role", "content", "name"}:
                return f"prompt message {i} must be an object with 'role' and 'content'"
            if message.get("role") not in ROLES:
                return f"prompt message {i} has role {message.get('role')!r}; expected one of {ROLES}"
            if not isinstance(message.get("content"), str):
                return f"prompt message {i} 'content' must be a string"
        if prompt[-1]["role"] == "assistant":
            return "the last prompt message is from the assistant; the model would have nothing to answer"
    else:
        return f"'prompt' must be a string or a list of messages, got {type(prompt).__name__}"
    label = row["label"]
    if not isinstance(label, str) or (not label.strip() and not allow_empty_label):
        return f"'label' must be a non-empty string, got {label!r}"
    return None
