"""Running sums: a task whose answer is long because every intermediate result is checked.

    python -m dataset.long_arith --n 4000 --out data/chain.jsonl [--steps 25] [--pattern random]

Each task gives a start number and numbers to add one at a time (``--pattern``: listed in the
prompt, one number every time, or 1, 2, 3, ...); the answer is one line per step,
``total + number = new total``. The ``chain`` reward (``evaluation.grader.score_chain``) credits
each step whose line adds the right number with the right sum, so k right lines of N score k/N
and a short answer cannot score: the length is what the task asks for, not a habit GRPO can
train away (on the quickstart's one-digit task, whose reward checks only the last number,
responses fell from ~100 to ~12 tokens).

The label is the JSON string ``{"start": S, "steps": [a, b, ...]}``; the scorer recomputes the
totals from it. ``solution`` holds the full answer (the worked examples of ``trainer.warmup``:
SmolLM2-135M-Instruct writes the format at temperature 1 only after a few, docs/long_task.md).

The long variant (``LONG_CHAIN``, the quickstart's ``--task chain100``): 100 numbers listed with
spaces between them, a full answer of 1,153-1,185 SmolLM2 tokens, ~4x the largest KV budget
trained. Its warm-up answers are half as long (``LONG_CHAIN_WARMUP``, 50 steps): the warm-up
teaches the format, and writing the whole chain is left for GRPO to learn (each further right line
earns 1/100), so a dense run has room to gain (docs/long_task.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path

from .formats import write_rows

EXAMPLE = "10 + 3 = 13\n13 + 4 = 17"  # not a task's numbers: copying it earns nothing
PATTERNS = ("random", "constant", "increasing")


@dataclasses.dataclass
class ChainConfig:
    steps: int = 25  # the full answer: 255-285 SmolLM2 tokens (docs/long_task.md)
    max_number: int = 9  # random / constant: each step adds 1..max_number
    max_start: int = 50  # the start is 10..max_start (two digits: every line is ~10+ tokens)
    # random: the numbers to add are listed in the prompt (the model must look them up, so the
    # prompt's KV matters to the end); constant: one number every step; increasing: 1, 2, 3, ...
    pattern: str = "random"
    separator: str = ", "  # between the listed numbers: ", " is 3 SmolLM2 tokens a number, " " is 2


# The long variant and its warm-up answers (see the module's docstring).
# Space-separated, the 100 numbers take 200 prompt tokens instead of 300: the prompt (319 tokens)
# is then ~21% of a dense sample at full length, and a kept prompt leaves room under a third of
# dense's pool.
LONG_CHAIN = ChainConfig(steps=100, separator=" ")
LONG_CHAIN_WARMUP = ChainConfig(steps=50, separator=" ")


def _numbers(rng: random.Random, config: ChainConfig) -> list[int]:
    if config.pattern == "random":
        return [rng.randint(1, config.max_number) for _ in range(config.steps)]
    if config.pattern == "constant":
        return [rng.randint(1, config.max_number)] * config.steps
    if config.pattern == "increasing":
        return list(range(1, config.steps + 1))
    raise ValueError(f"unknown chain pattern {config.pattern!r}; choose one of {', '.join(PATTERNS)}")


def chain_task(rng: random.Random, config: ChainConfig = ChainConfig()) -> dict:
    """``start``, the numbers to add (``steps``) and the running ``totals``."""
    start = rng.randint(10, config.max_start)
    steps, totals = _numbers(rng, config), []
    for x in steps:
        totals.append((totals[-1] if totals else start) + x)
    return {"start": start, "steps": steps, "totals": totals}


def chain_question(start: int, steps: list[int], pattern: str, separator: str = ", ") -> str:
    n = len(steps)
    what = {"random": f"add these {n} numbers one at a time, in order: {separator.join(map(str, steps))}",
            "constant": f"add {steps[0]} to the total {n} times, one addition at a time",
            "increasing": f"add 1, then 2, then 3, and so on up to {n}, one addition at a time"}[pattern]
    return (f"Start with {start}. Then {what}.\nAfter each addition, write the step on its own line "
            f"as 'total + number = new total'. For example, starting with 10 and adding 3 and then "
            f"4:\n{EXAMPLE}\nWrite all {n} lines.")


def chain_solution(start: int, steps: list[int], totals: list[int]) -> str:
    """The full answer: one ``total + number = new total`` line per step."""
    before = [start] + totals[:-1]
    return "\n".join(f"{a} + {x} = {c}" for a, x, c in zip(before, steps, totals))


def chain_rows(n: int, seed: int, config: ChainConfig = ChainConfig()) -> list[dict]:
    """``n`` rows with chat-message prompts (the consumer applies the model's template) and the
    full answer as ``solution`` (worked examples for a supervised warm-up)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        t = chain_task(rng, config)
        question = chain_question(t["start"], t["steps"], config.pattern, config.separator)
        rows.append({"prompt": [{"role": "user", "content": question}],
                     "label": json.dumps({"start": t["start"], "steps": t["steps"]}), "task": "chain",
                     "totals": t["totals"], "solution": chain_solution(t["start"], t["steps"], t["totals"])})
    return rows


def long_chain_rows(n: int, seed: int) -> list[dict]:
    """Rows of the long variant: 100 numbers to add."""
    return chain_rows(n, seed, LONG_CHAIN)


def long_chain_demos(n: int, seed: int) -> list[dict]:
    """Worked answers for the long variant's warm-up: the same task at 50 steps."""
    return chain_rows(n, seed, LONG_CHAIN_WARMUP)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataset.long_arith",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--out", type=Path, required=True, help="output .jsonl (or .parquet with pyarrow)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=ChainConfig.steps)
    p.add_argument("--max-number", type=int, default=ChainConfig.max_number)
    p.add_argument("--max-start", type=int, default=ChainConfig.max_start)
    p.add_argument("--pattern", choices=PATTERNS, default=ChainConfig.pattern)
    a = p.parse_args(argv)
    if a.n < 1 or a.steps < 1 or a.max_number < 1 or a.max_start < 10:
        p.error("--n, --steps and --max-number must be >= 1, --max-start >= 10")
    config = ChainConfig(a.steps, a.max_number, a.max_start, a.pattern)
    count = write_rows(a.out, chain_rows(a.n, a.seed, config))
    print(f"wrote {count} chain tasks to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
