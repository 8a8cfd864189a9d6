"""Countdown-3to4 tasks with the R1-style ``<think>``/``<answer>`` prompt (TinyZero's recipe).

    python -m dataset.countdown_r1 --split train --n 20000 --out data/countdown/train.jsonl [--seed 0] [--chat]
    python -m dataset.countdown_r1 --split test  --n 512   --out data/countdown/test.jsonl

3 or 4 numbers in 1-100 and a target in 1-100 reached by an exact-integer expression of them
(kept in ``solution``). A task's split comes from a hash of its numbers and target (10% test),
so train and test never share a task whatever the seeds and sizes; the seed orders the draw.
The label is ``{"target": T, "numbers": [...]}``; ``evaluation.grader.score_countdown_r1``
scores an answer (base 0.0 / format 0.1 / correct 1.0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

from .formats import write_rows
from .synthetic import CountdownConfig, countdown_task

CONFIG = CountdownConfig(min_numbers=3, max_numbers=4, max_number=100, max_target=100)
TEST_PERCENT = 10
SYSTEM = ("You are a helpful assistant. You first think about the reasoning process in the mind "
          "and then provide the user with the answer.")


def split_of(numbers: list[int], target: int) -> str:
    key = f"{sorted(numbers)}:{target}".encode()
    return "test" if int(hashlib.sha1(key).hexdigest(), 16) % 100 < TEST_PERCENT else "train"


def question(numbers: list[int], target: int) -> str:
    return (f"Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
            "arithmetic operations (+, -, *, /) and each number can only be used once. Show your "
            "work in <think> </think> tags. And return the final answer in <answer> </answer> tags, "
            "for example <answer> (1 + 2) / 3 </answer>.")


def prompt(numbers: list[int], target: int, chat: bool):
    """Chat messages, or the base-model template ending inside ``<think>`` (R1-Zero style)."""
    if chat:
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": question(numbers, target)}]
    return (f"{SYSTEM}\nUser: {question(numbers, target)}\n"
            "Assistant: Let me solve this step by step.\n<think>")


def make_rows(split: str, n: int, seed: int, chat: bool) -> list[dict]:
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < n:
        task = countdown_task(rng, CONFIG)
        key = (tuple(sorted(task["numbers"])), task["target"])
        if split_of(task["numbers"], task["target"]) != split or key in seen:
            continue
        seen.add(key)
        rows.append({"prompt": prompt(task["numbers"], task["target"], chat),
                     "label": json.dumps({"target": task["target"], "numbers": task["numbers"]}),
                     "task": "countdown", "solution": task["solution"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataset.countdown_r1",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--split", choices=["train", "test"], required=True)
    p.add_argument("--n", type=int, default=1000, help="tasks to write (default 1000)")
    p.add_argument("--out", type=Path, required=True, help="output .jsonl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chat", action="store_true", help="chat messages instead of the base template")
    args = p.parse_args(argv)
    if args.n < 1:
        p.error("--n must be at least 1")
    count = write_rows(args.out, make_rows(args.split, args.n, args.seed, args.chat))
    print(f"wrote {count} countdown {args.split} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
