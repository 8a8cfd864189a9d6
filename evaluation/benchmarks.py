"""Benchmark loaders: each benchmark's question field and gold answer (eval.md section 1.4).

Files are ``<data_dir>/<name>/test.jsonl``. A benchmark argument that is a path to a ``.jsonl``
file is read as a local benchmark: question from ``question``/``problem``/``prompt``, gold from
``answer``/``gold``/``label``/``final_answer`` (or the last box of ``solution``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from dataset.formats import iter_rows

from .grader import last_boxed

BENCHMARKS = ("gsm8k", "math500", "minerva_math", "olympiadbench", "gaokao2023en", "aime24", "amc23")
MANY_SAMPLE_BENCHMARKS = ("aime24", "amc23")  # the reference samples these 32 times
_REPO_ROOT = Path(__file__).resolve().parent.parent


def default_data_dir() -> Path:
    """``$SPARSE_RL_EVAL_DATA``, else ``<repo>/../shared/data/eval``, else ``<repo>/data/eval``."""
    env = os.environ.get("SPARSE_RL_EVAL_DATA")
    if env:
        return Path(env)
    shared = _REPO_ROOT.parent / "shared" / "data" / "eval"
    return shared if shared.is_dir() else _REPO_ROOT / "data" / "eval"


@dataclasses.dataclass
class Problem:
    idx: int
    question: str
    gold: str
    extra: dict = dataclasses.field(default_factory=dict)


def _strip_dollars(s) -> str:
    return str(s).strip().strip("$").strip()


def _gold_from_solution(row: dict, path: Path, lineno: int) -> str:
    boxed = last_boxed(row.get("solution", "") or "")
    if boxed is None:
        if row.get("answer") not in (None, ""):
            return str(row["answer"])
        raise ValueError(f"{path}:{lineno}: no \\boxed{{}} in 'solution' and no 'answer' field")
    return boxed


def gold_for(name: str, row: dict, path: Path, lineno: int) -> str:
    """The gold answer of one row of benchmark ``name``."""
    try:
        if name == "gsm8k":
            return str(row["answer"]).split("####")[-1].strip().replace(",", "")
        if name in ("math500", "minerva_math"):
            return _gold_from_solution(row, path, lineno)
        if name == "olympiadbench":
            answers = row["final_answer"]
            return _strip_dollars(answers[0] if isinstance(answers, list) else answers)
        if name in ("aime24", "amc23", "gaokao2023en"):
            return _strip_dollars(row["answer"])
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"{path}:{lineno}: {name} row lacks its gold field ({exc!r})") from None
    for key in ("answer", "gold", "label", "final_answer"):
        if row.get(key) not in (None, "", []):
            value = row[key]
            return _strip_dollars(value[0] if isinstance(value, list) else value)
    if "solution" in row:
        return _gold_from_solution(row, path, lineno)
    raise ValueError(f"{path}:{lineno}: no gold field (answer/gold/label/final_answer/solution)")


def _question_for(row: dict, path: Path, lineno: int) -> str:
    for key in ("question", "problem", "prompt", "input"):
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key]
    raise ValueError(f"{path}:{lineno}: no question field (question/problem/prompt/input)")


def benchmark_path(name: str, data_dir: Path | None = None) -> Path:
    if name.endswith(".jsonl") or os.sep in name:
        return Path(name)
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)} or give a .jsonl path")
    return Path(data_dir or default_data_dir()) / name / "test.jsonl"


def benchmark_name(name: str) -> str:
    """A directory-safe name: the benchmark name, or a local file's stem."""
    return Path(name).stem if (name.endswith(".jsonl") or os.sep in name) else name


def load_benchmark(name: str, data_dir: Path | None = None, limit: int | None = None) -> list[Problem]:
    """Problems of benchmark ``name`` (a known name or a JSONL path). Bad rows raise
    ``ValueError`` naming file and line."""
    path = benchmark_path(name, data_dir)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file {path} not found; the eval sets are looked up in "
                                f"--data-dir, else $SPARSE_RL_EVAL_DATA, else ../shared/data/eval "
                                f"beside the checkout, else data/eval in it (evaluation/README.md)")
    kind = name if name in BENCHMARKS else "local"
    problems = []
    for lineno, row in iter_rows(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object")
        question = _question_for(row, path, lineno)
        gold = gold_for(kind, row, path, lineno)
        if gold.lower() in ("true", "false"):
            question += " (True or False)"
        elif gold.lower() in ("yes", "no"):
            question += " (Yes or No)"
        extra = {k: row[k] for k in ("level", "subject", "type", "unique_id", "id", "subfield")
                 if k in row and isinstance(row[k], (str, int, float))}
        problems.append(Problem(len(problems), question, gold, extra))
        if limit is not None and len(problems) >= limit:
            break
    return problems
