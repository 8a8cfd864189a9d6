"""Grader throughput (pairs/s) on MATH-500 gold answers paired with perturbed predictions.

    python -m benchmarks.training.grader [--data ../shared/data/eval/math500/test.jsonl] [--copies 4]

Each gold answer gets four predictions, each a completion ending in a box: the gold itself, a
cosmetic rewrite (``\\left``/``\\right``, spacing, ``\\dfrac``, integers as ``n.0``), a wrong
answer (a digit changed), and the gold stated as "the answer is ...". Measured: one core
(``grade`` in a loop in this process) and all cores (``grade_many``, worker processes with a
per-item timeout; pool start-up excluded, measured separately). Prints a Markdown row.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import re
import sys
import time
from pathlib import Path

from tqdm import tqdm


from evaluation.grader import GraderPool, grade, last_boxed

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class BenchConfig:
    data: Path
    copies: int
    workers: int
    timeout: float
    seed: int


def perturb_wrong(gold: str, rng: random.Random) -> str:
    digits = [m.start() for m in re.finditer(r"\d", gold)]
    if not digits:
        return gold + "+1"
    i = rng.choice(digits)
    return gold[:i] + str((int(gold[i]) + rng.randint(1, 9)) % 10) + gold[i + 1:]


def cosmetic(gold: str) -> str:
    s = gold.replace("\\frac", "\\dfrac").replace("(", "\\left(").replace(")", "\\right)").replace(",", ", ")
    return s + ".0" if re.fullmatch(r"-?\d+", s) else s


def make_pairs(golds: list[str], rng: random.Random) -> list[tuple[str, str]]:
    pairs = []
    for gold in golds:
        pairs.append((f"Some reasoning. Hence $\\boxed{{{gold}}}$.", gold))
        pairs.append((f"We simplify and get \\boxed{{{cosmetic(gold)}}}", gold))
        pairs.append((f"A mistake happens, so \\boxed{{{perturb_wrong(gold, rng)}}}", gold))
        pairs.append((f"Therefore, the answer is ${gold}$.", gold))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/eval/math500/test.jsonl",
                        help="MATH-500 test.jsonl (gold = last box of 'solution')")
    parser.add_argument("--copies", type=int, default=1, help="repeat the pair set this many times")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for the all-core run")
    parser.add_argument("--timeout", type=float, default=5.0, help="per-pair timeout in the pool (s)")
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    config = BenchConfig(a.data, a.copies, a.workers, a.timeout, a.seed)
    if not config.data.is_file():
        print(f"error: {config.data} not found", file=sys.stderr)
        return 2
    golds = [last_boxed(json.loads(line)["solution"]) for line in config.data.read_text().splitlines() if line.strip()]
    pairs = make_pairs([g for g in golds if g], random.Random(config.seed)) * config.copies

    grade("\\boxed{1}", "1")  # import latex2sympy2/antlr before timing
    start = time.perf_counter()
    correct_one = 0
    slowest = 0.0
    for pred, gold in tqdm(pairs, desc="one core", unit="pair"):
        t = time.perf_counter()
        correct_one += grade(pred, gold)
        slowest = max(slowest, time.perf_counter() - t)
    one_core = len(pairs) / (time.perf_counter() - start)

    t = time.perf_counter()
    with GraderPool(workers=config.workers, timeout=config.timeout) as pool:
        pool.map([("\\boxed{1}", "1")] * config.workers)
        startup = time.perf_counter() - t
        start = time.perf_counter()
        results = pool.map(pairs, progress=True, desc=f"{config.workers} workers")
        all_cores = len(pairs) / (time.perf_counter() - start)
    correct_pool = sum(r.correct for r in results)
    timeouts = sum(r.timed_out for r in results)

    print(f"\n{len(pairs)} pairs ({len(golds)} gold answers x 4 predictions x {config.copies}); "
          f"correct: {correct_one} in-process, {correct_pool} in the pool; {timeouts} timeouts; "
          f"slowest single pair {1000 * slowest:.0f} ms; pool start-up {startup:.2f} s")
    print(f"one core: {one_core:.0f} pairs/s; {config.workers} workers: {all_cores:.0f} pairs/s\n")
    cmd = "python -m benchmarks.training.grader" + (f" --copies {config.copies}" if config.copies != 1 else "")
    print("| date | machine | command | pairs/s (1 core) | pairs/s (all cores) |")
    print("|---|---|---|---|---|")
    print(f"| {datetime.date.today().isoformat()} | {os.cpu_count()}-core CPU | `{cmd}` | {one_core:.0f} | "
          f"{all_cores:.0f} ({config.workers} workers) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
