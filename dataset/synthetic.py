"""Synthetic tasks with known answers, for the quickstart and tests.

    python -m dataset.synthetic countdown  --n 1000 --out data/countdown.jsonl [--seed 0] [--chat]
    python -m dataset.synthetic arithmetic --n 1000 --out data/arith.jsonl --steps 3

* ``countdown``: reach a target with given numbers, each used once, with ``+ - * /``. Every task
  is built from a random expression, so it has a solution (kept in ``solution``). The label is
  the JSON string ``{"target": T, "numbers": [...]}``; ``evaluation.grader.score_countdown``
  checks an answer (this package only generates data).
* ``arithmetic``: evaluate a multi-step integer expression (``steps`` operations); the label is
  the exact integer result (division only where it is exact).

Rows follow ``dataset/README.md``: a raw ChatML prompt (``qwen-boxed`` style) or, with
``--chat``, system + user messages; answers go in ``\\boxed{}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from fractions import Fraction
from pathlib import Path

from tqdm import tqdm

from .formats import write_rows

SYSTEM = "You are a helpful assistant."
BOXED = "Please reason step by step, and put your final answer within \\boxed{}."
_OPS = "+-*/"


def _messages(user: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _chatml(user: str) -> str:
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n")


def _apply(op: str, a: Fraction, b: Fraction) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b != 0 else None


def _random_expression(rng: random.Random, values: list[int], exact_integers: bool) -> tuple[str, Fraction] | None:
    """Combine ``values`` (in random order) into one expression; None if a step is not allowed."""
    items = [(str(v), Fraction(v)) for v in values]
    rng.shuffle(items)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (ea, va), (eb, vb) = items[i], items[j]
        op = rng.choice(_OPS)
        value = _apply(op, va, vb)
        if value is None or (exact_integers and value.denominator != 1) or value < 0:
            return None
        items = [x for k, x in enumerate(items) if k not in (i, j)] + [(f"({ea} {op} {eb})", value)]
    return items[0]


@dataclasses.dataclass
class CountdownConfig:
    min_numbers: int = 3
    max_numbers: int = 4
    max_number: int = 99
    max_target: int = 999


def countdown_task(rng: random.Random, config: CountdownConfig = CountdownConfig()) -> dict:
    """One solvable countdown task: ``numbers``, ``target`` and a ``solution`` expression."""
    while True:
        count = rng.randint(config.min_numbers, config.max_numbers)
        numbers = [rng.randint(1, config.max_number) for _ in range(count)]
        built = _random_expression(rng, numbers, exact_integers=True)
        if built is None:
            continue
        expr, value = built
        if 1 <= value <= config.max_target:
            solution = expr[1:-1] if expr.startswith("(") and expr.endswith(")") else expr
            return {"numbers": numbers, "target": int(value), "solution": solution}


def countdown_question(numbers: list[int], target: int) -> str:
    return (f"Using the numbers {numbers}, create an equation that equals {target}. You can use +, -, * and /, "
            f"and each number must be used exactly once. {BOXED[:-1]} as an expression, for example "
            f"\\boxed{{(1 + 2) * 3}}.")


def arithmetic_task(rng: random.Random, steps: int = 3, max_operand: int = 20) -> dict:
    """A ``steps``-operation integer expression and its exact value."""
    while True:
        built = _random_expression(rng, [rng.randint(1, max_operand) for _ in range(steps + 1)], exact_integers=True)
        if built is not None:
            expr, value = built
            expr = expr[1:-1] if steps >= 1 else expr
            return {"expression": expr, "answer": int(value)}


def make_rows(task: str, n: int, seed: int, chat: bool, steps: int = 3) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in tqdm(range(n), desc=f"generate {task}", unit="task"):
        if task == "countdown":
            t = countdown_task(rng)
            question = countdown_question(t["numbers"], t["target"])
            label = json.dumps({"target": t["target"], "numbers": t["numbers"]})
            extra = {"solution": t["solution"]}
        elif task == "arithmetic":
            t = arithmetic_task(rng, steps)
            question = f"Compute {t['expression']}.\n{BOXED}"
            label = str(t["answer"])
            extra = {"expression": t["expression"]}
        else:
            raise ValueError(f"unknown task {task!r}; choose countdown or arithmetic")
        rows.append({"prompt": _messages(question) if chat else _chatml(question), "label": label,
                     "task": task, **extra})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataset.synthetic",
                                     description="Generate synthetic prompt/label tasks with known answers.")
    parser.add_argument("task", choices=["countdown", "arithmetic"], help="which task")
    parser.add_argument("--n", type=int, default=1000, help="number of tasks (default 1000)")
    parser.add_argument("--out", type=Path, required=True, help="output .jsonl (or .parquet with pyarrow)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--steps", type=int, default=3, help="operations per arithmetic task (default 3)")
    parser.add_argument("--chat", action="store_true", help="chat-message prompts instead of a ChatML string")
    args = parser.parse_args(argv)
    if args.n < 1 or args.steps < 1:
        parser.error("--n and --steps must be at least 1")
    count = write_rows(args.out, make_rows(args.task, args.n, args.seed, args.chat, args.steps))
    print(f"wrote {count} {args.task} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
