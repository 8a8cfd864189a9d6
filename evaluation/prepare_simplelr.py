"""Rebuild ``simplelr_qwen_level3to5`` and ``simplelr_level3to5`` (MATH levels 3-5, SimpleRL prompt).

    python -m evaluation.prepare_simplelr --source PATH --out-dir data/train
    python -m evaluation.prepare_simplelr --download --out-dir data/train      # needs the network

``--source`` may be
  * the SimpleRL v0 JSON array (``math_level3to5_data_processed_with_qwen_prompt.json``: keys
    ``question``, ``gt_answer``/``answer``, ``level``), which ``--download`` fetches;
  * a JSONL file of MATH rows (``problem`` + ``solution``, or ``question`` + ``answer``; ``level``);
  * a directory of the original MATH release (``<subject>/<n>.json`` with ``problem``, ``level``
    such as "Level 4", ``solution``; the gold is the last ``\\boxed{}`` of the solution).

Rows outside levels 3-5 are dropped; order is kept. Outputs, in the formats of
``dataset/README.md``: ``<out>/simplelr_qwen_level3to5/train.jsonl`` (a raw ChatML string
prompt) and ``<out>/simplelr_level3to5/train.jsonl`` (system + user messages). The user turn is
the question, a newline and the reference instruction, written with the doubled braces
``\\boxed{{}}`` exactly as the published SimpleRL data has them.

It lives in ``evaluation`` rather than ``dataset`` because reading a MATH solution's gold answer
is answer extraction (``evaluation.grader.last_boxed``, as the benchmark loaders do), and
``dataset`` imports nothing from ``evaluation``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from dataset.formats import iter_rows, write_rows

from .grader import last_boxed
from .progress import progress_bar

PUBLIC_SOURCE = ("https://raw.githubusercontent.com/hkust-nlp/simpleRL-reason/v0/train/data/"
                 "math_level3to5_data_processed_with_qwen_prompt.json")
SYSTEM = "You are a helpful assistant."
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{{}}."
LEVELS = (3, 4, 5)


@dataclasses.dataclass
class MathProblem:
    question: str
    answer: str
    level: int
    origin: str  # "file:line" or "file" for error messages


def user_content(question: str) -> str:
    return f"{question}\n{INSTRUCTION}"


def qwen_row(p: MathProblem) -> dict:
    prompt = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user_content(p.question)}"
              f"<|im_end|>\n<|im_start|>assistant\n")
    return {"prompt": prompt, "label": p.answer}


def chat_row(p: MathProblem) -> dict:
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user_content(p.question)}],
            "label": p.answer}


def _level(value, origin: str) -> int:
    m = re.search(r"\d+", str(value))
    if not m:
        raise ValueError(f"{origin}: cannot read a level from {value!r}")
    return int(m.group(0))


def _from_row(row: dict, origin: str) -> MathProblem:
    if not isinstance(row, dict):
        raise ValueError(f"{origin}: expected a JSON object")
    question = row.get("question") or row.get("problem")
    if not isinstance(question, str):
        raise ValueError(f"{origin}: no 'question' or 'problem' string")
    answer = None
    for key in ("gt_answer", "answer", "ground_truth_answer", "target"):
        if isinstance(row.get(key), str):
            answer = row[key]
            break
    if answer is None and isinstance(row.get("solution"), str):
        answer = last_boxed(row["solution"])
    if answer is None:
        raise ValueError(f"{origin}: no answer field and no \\boxed{{}} in 'solution'")
    if "level" not in row:
        raise ValueError(f"{origin}: no 'level'")
    return MathProblem(question, answer, _level(row["level"], origin), origin)


def read_source(source: Path) -> list[MathProblem]:
    """All problems of ``source`` (any level); bad entries raise ``ValueError`` naming them."""
    if source.is_dir():
        files = sorted(source.rglob("*.json"), key=lambda p: (str(p.parent), int(p.stem) if p.stem.isdigit() else p.stem))
        if not files:
            raise ValueError(f"{source}: no *.json files (expected the MATH layout <subject>/<n>.json)")
        return [_from_row(json.loads(f.read_text(encoding="utf-8")), str(f)) for f in files]
    text = source.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = json.loads(text)
        return [_from_row(row, f"{source}[{i}]") for i, row in enumerate(rows)]
    return [_from_row(row, f"{source}:{lineno}") for lineno, row in iter_rows(source)]


def download(dest: Path, url: str = PUBLIC_SOURCE) -> Path:
    """Fetch the public SimpleRL v0 file to ``dest`` (skipped when it is already there). No
    network, or an HTTP error: ``OSError`` with one line saying what to do instead."""
    import requests

    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    try:
        with requests.get(url, stream=True, timeout=60) as response:
            response.raise_for_status()
            with open(tmp, "wb") as f:
                for chunk in progress_bar(response.iter_content(1 << 20), desc="download", unit="MiB"):
                    f.write(chunk)
    except requests.RequestException as e:
        tmp.unlink(missing_ok=True)  # never a half file that a rerun would take for the source
        raise OSError(f"--download: cannot fetch {url} ({_reason(e)}); without network, fetch "
                      f"that file elsewhere and pass it with --source FILE") from None
    tmp.rename(dest)
    return dest


def _reason(e: Exception) -> str:
    """A request error in a few words: the HTTP status, or the error's class (requests' own
    messages nest the whole retry history)."""
    response = getattr(e, "response", None)
    if response is not None:
        return f"HTTP {response.status_code}"
    return type(e).__name__


def prepare(problems: list[MathProblem], out_dir: Path) -> dict[str, int]:
    kept = [p for p in progress_bar(problems, desc="filter levels 3-5", unit="row") if p.level in LEVELS]
    counts = {
        "simplelr_qwen_level3to5": write_rows(out_dir / "simplelr_qwen_level3to5" / "train.jsonl", map(qwen_row, kept)),
        "simplelr_level3to5": write_rows(out_dir / "simplelr_level3to5" / "train.jsonl", map(chat_row, kept)),
    }
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.prepare_simplelr",
        allow_abbrev=False, description="Rebuild the SimpleRL MATH level 3-5 training sets.")
    parser.add_argument("--source", type=Path, help="local MATH copy: v0 JSON array, JSONL, or MATH directory")
    parser.add_argument("--download", action="store_true", help=f"fetch the public source ({PUBLIC_SOURCE})")
    parser.add_argument("--out-dir", type=Path, required=True, help="where the two dataset folders are written")
    args = parser.parse_args(argv)
    if bool(args.source) == bool(args.download):
        parser.error("give exactly one of --source or --download")
    try:
        source = args.source or download(args.out_dir / "source" / Path(PUBLIC_SOURCE).name,
                                         PUBLIC_SOURCE)
        problems = read_source(source)
    except (OSError, ValueError) as exc:
        print(f"python -m evaluation.prepare_simplelr: error: {exc}", file=sys.stderr)
        return 2
    counts = prepare(problems, args.out_dir)
    print(f"read {len(problems)} problems from {source}; wrote " +
          ", ".join(f"{name}: {n} rows" for name, n in counts.items()) + f" under {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
