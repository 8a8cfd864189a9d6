"""Long-tailed response lengths for benchmarks on random weights (a generate plug-in).

A random checkpoint never emits EOS, so every response would run to the cap; RL responses do not:
most are short and a few reach the cap, and those few hold the rollout. This plug-in gives sample
i of the rollout its own ``max_new_tokens`` drawn from a log-normal distribution (median
``median_frac * cap``, log-space spread ``sigma``) clipped to ``[min_len, cap]``; the draw
depends only on (seed, rollout, sample index in the engine's shard), so dense and compressed
runs get the same lengths.
Lengths are rounded down onto ``buckets`` geometric levels, since the generate context batches
one group per distinct length (concurrently, into the same engine).

    --custom-generate-function-path benchmarks.common.long_tail.LongTailLengths \\
    --custom-generate-args cap=4096 median_frac=0.25 sigma=0.8

(the repository root must be importable: the benchmarks run as ``python -m benchmarks...`` from it.)
"""

from __future__ import annotations

import math
import random

from trainer.rollout.samples.generate import Request
from trainer.rollout.samples.traces import Call, Trace


def long_tail_length(index: int, seed: int, cap: int, median_frac: float, sigma: float,
                     min_len: int) -> int:
    """One sample's length: log-normal around median_frac * cap, clipped to [min_len, cap]."""
    z = random.Random(seed * 1_000_003 + index).gauss(0.0, 1.0)
    return int(min(cap, max(min_len, median_frac * cap * math.exp(sigma * z))))


def bucket_levels(cap: int, min_len: int, buckets: int) -> list[int]:
    """Geometric levels from min_len to cap (cap itself is a level: truncated samples stay so)."""
    ratio = (cap / min_len) ** (1.0 / max(1, buckets - 1))
    return sorted({min(cap, int(min_len * ratio ** k)) for k in range(buckets)} | {cap})


def round_down(length: int, levels: list[int]) -> int:
    return max(v for v in levels if v <= length) if length >= levels[0] else levels[0]


class LongTailLengths:
    def __init__(self, cap: int, median_frac: float = 0.25, sigma: float = 0.8,
                 min_len: int | None = None, buckets: int = 24, seed: int = 0, warmup_scale: float = 1.0):
        min_len = max(1, min(64, int(cap) // 8)) if min_len is None else min_len
        if not 0 < min_len <= cap:
            raise ValueError(f"need 0 < min_len <= cap (got min_len={min_len}, cap={cap})")
        self.cap, self.median_frac, self.sigma = int(cap), float(median_frac), float(sigma)
        self.min_len, self.seed = int(min_len), int(seed)
        self.levels = bucket_levels(self.cap, self.min_len, int(buckets))
        self.rollouts = 0  # a fresh set of lengths every rollout
        # the first rollout (a benchmark's warm-up: compiles, graph captures) may run shorter
        self.warmup_scale = float(warmup_scale)

    def lengths(self, count: int) -> list[int]:
        base = self.rollouts * 10_000_019
        scale = self.warmup_scale if self.rollouts == 0 else 1.0
        return [max(1, int(scale * round_down(long_tail_length(
                    base + i, self.seed, self.cap, self.median_frac, self.sigma, self.min_len),
                    self.levels))) for i in range(count)]

    def __call__(self, ctx, prompts, n: int) -> list[Trace]:
        lengths = self.lengths(len(prompts) * n)
        self.rollouts += 1
        requests = [Request(prompts[i // n].input_ids, lengths[i]) for i in range(len(lengths))]
        gens = ctx.generate(requests)
        return [Trace([Call(prompts[i // n].input_ids, g)], g.text, i // n)
                for i, g in enumerate(gens)]
