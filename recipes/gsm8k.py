"""GSM8K, AReaL-style (inclusionAI/AReaL examples/math/gsm8k_grpo.yaml): group size 4, rewards
(r - 0.5) x 10, the decoupled loss with the behaviour importance weight capped at 5, token-budget
micro-batches; ``scripts/run-gsm8k.sh`` sets those flags.

No GSM8K *training* set can be installed here (the registries hold none; loaders fetch it from a
hub), so training uses a held-apart slice of the GSM8K test file and evaluation only the rest:

    python -m recipes.gsm8k --gsm8k-file shared/data/eval/gsm8k/test.jsonl --out-dir runs/data/gsm8k

writes ``train.jsonl`` (rows 319-1318, 1,000 problems) and ``heldout.jsonl`` (rows 0-318, never
trained on); questions in the chat template with verl's GSM8K instruction, labels the ``####``
numbers (``evaluation.benchmarks.gold_for`` reads them; the built-in ``gsm8k`` reward grades them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dataset.formats import iter_rows, write_rows
from evaluation.benchmarks import gold_for

HELDOUT = 319  # the first 319 test problems are evaluation only; the other 1,000 train
INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def read_problems(path: Path) -> list[tuple[str, str]]:
    """(question, gold) of every row; the gold is the number after ``####``."""
    if not path.is_file():
        raise ValueError(f"--gsm8k-file {path}: file not found")
    out = []
    for lineno, row in iter_rows(path):
        if not isinstance(row, dict) or not isinstance(row.get("question"), str):
            raise ValueError(f"{path}:{lineno}: expected an object with a 'question' string")
        out.append((row["question"], gold_for("gsm8k", row, path, lineno)))
    return out


def rows(problems, start: int) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"{q}\n{INSTRUCTION}"}], "label": gold,
             "task": "gsm8k", "source_index": start + i} for i, (q, gold) in enumerate(problems)]


def prepare(gsm8k_file: Path, out_dir: Path) -> dict[str, int]:
    problems = read_problems(Path(gsm8k_file))
    if len(problems) <= HELDOUT:
        raise ValueError(f"{gsm8k_file}: {len(problems)} problems; need more than {HELDOUT}")
    return {"heldout": write_rows(out_dir / "heldout.jsonl", rows(problems[:HELDOUT], 0)),
            "train": write_rows(out_dir / "train.jsonl", rows(problems[HELDOUT:], HELDOUT))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m recipes.gsm8k",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--gsm8k-file", type=Path, required=True, help="GSM8K test.jsonl (question, answer)")
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        counts = prepare(args.gsm8k_file, args.out_dir)
    except (OSError, ValueError) as e:
        print(f"recipes.gsm8k: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {counts['train']} training and {counts['heldout']} held-out problems to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
