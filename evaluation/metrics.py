"""Benchmark metrics: avg@n, unbiased pass@k, truncation ratio, response length."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``c`` correct out of ``n`` samples: 1 - C(n-c,k)/C(n,k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    # C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i), stable for large n
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def k_values(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [2 ** i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []
    if n >= 1 and ks[-1] != n:
        ks.append(n)
    return ks


def benchmark_metrics(records: list[dict]) -> dict:
    """Metrics of one benchmark from its per-problem records (``scores``, ``finish_reasons``,
    ``response_tokens``, ``grader_timeouts``; all lists of length n)."""
    if not records:
        return {"num_problems": 0}
    n = min(len(r["scores"]) for r in records)
    if n == 0:
        return {"num_problems": len(records), "n_samples": 0}
    scores = [[bool(s) for s in r["scores"][:n]] for r in records]
    flat = [s for row in scores for s in row]
    finish = [f for r in records for f in r["finish_reasons"][:n]]
    tokens = [t for r in records for t in r["response_tokens"][:n] if t is not None]
    metrics = {
        "num_problems": len(records),
        "n_samples": n,
        "num_scores": len(flat),
        f"avg@{n}": round(100.0 * sum(flat) / len(flat), 2),
        "pass@k": {str(k): round(100.0 * sum(pass_at_k(n, sum(row), k) for row in scores) / len(scores), 2)
                   for k in k_values(n)},
        "truncation_ratio": round(sum(f == "length" for f in finish) / len(finish), 4),
        "mean_response_tokens": round(sum(tokens) / len(tokens), 1) if tokens else None,
        "grader_timeouts": sum(sum(bool(t) for t in r.get("grader_timeouts", [])) for r in records),
        "generation_errors": sum(f == "error" for f in finish),
        "empty_answers": sum(e is None for r in records for e in r.get("extracted", [])[:n]),
    }
    metrics["accuracy"] = metrics[f"avg@{n}"]
    return metrics
