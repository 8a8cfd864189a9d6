"""Paired statistics of the correction grid (issue 51): each config against dense in the same
seed, with 95% intervals and the non-inferiority verdict.

Every config of a seed shares dense's warm-up, data order and held-out prompts, so the unit of
comparison is the per-seed difference ``acc(config, s) - acc(dense, s)``. Two intervals:

* **primary**: Student's t over the per-seed differences (n seeds, n - 1 degrees of freedom).
  The seeds are the independent replications of training, so this interval carries the run-to-run
  variance that decides whether a config trains as well as dense.
* **secondary**: a per-prompt paired bootstrap pooling the seeds: the differences of every
  (seed, prompt) pair, resampled with replacement. It holds the prompts' sampling error only
  (it treats the seeds' runs as fixed), so it is narrower; read it as how well the eval set
  resolves the difference, not as the training's spread.

A config is non-inferior when the primary interval's lower bound is at or above ``-margin``
(3 points of accuracy).
"""

from __future__ import annotations

import dataclasses
import math
import random

# Student's t, two-sided 95% (the 0.975 quantile), for 1..30 degrees of freedom.
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
_Z975 = 1.959964
MARGIN = 0.03  # non-inferiority: 3 points of accuracy
DEPLOY_MARGIN = 0.10  # deployed compressed, against dense: within 10 points


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t (a table to 30; Cornish-Fisher beyond, error < 1e-4)."""
    if df < 1:
        raise ValueError(f"t quantile needs >= 1 degree of freedom, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclasses.dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    def fmt(self, digits: int = 3, signed: bool = True) -> str:
        if math.isnan(self.mean):
            return "-"
        sign = "+" if signed else ""
        if math.isnan(self.low):
            return f"{self.mean:{sign}.{digits}f} (n={self.n})"
        return f"{self.mean:{sign}.{digits}f} [{self.low:{sign}.{digits}f}, {self.high:{sign}.{digits}f}]"


NAN = Interval(math.nan, math.nan, math.nan, 0)


def t_interval(values: list[float]) -> Interval:
    """Mean and 95% Student-t interval of ``values`` (NaNs dropped; one value: no interval)."""
    values = [v for v in values if not math.isnan(v)]
    n = len(values)
    if n == 0:
        return NAN
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, math.nan, math.nan, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def bootstrap_interval(values: list[float], resamples: int = 10_000, seed: int = 0) -> Interval:
    """Mean and 95% percentile-bootstrap interval of ``values`` (resampled with replacement)."""
    import numpy as np

    data = np.asarray([v for v in values if not math.isnan(v)], dtype=np.float64)
    if data.size == 0:
        return NAN
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return Interval(float(data.mean()), float(low), float(high), int(data.size))


def paired_differences(config: dict[int, float], dense: dict[int, float]) -> list[float]:
    """Per seed both have: config minus dense."""
    return [config[s] - dense[s] for s in sorted(config) if s in dense
            and not (math.isnan(config[s]) or math.isnan(dense[s]))]


def prompt_differences(config: dict[int, list[float]], dense: dict[int, list[float]]) -> list[float]:
    """Per (seed, prompt), pooled over the seeds both have: config minus dense on the same prompt."""
    out = []
    for seed in sorted(config):
        ours, theirs = config[seed], dense.get(seed)
        if theirs is None or not ours or len(ours) != len(theirs):
            continue
        out += [a - b for a, b in zip(ours, theirs)]
    return out


def verdict(interval: Interval, margin: float) -> str:
    """``pass`` when the lower bound is at or above ``-margin``; otherwise by how much it misses."""
    if math.isnan(interval.low):
        return "- (needs >= 2 seeds)"
    if interval.low >= -margin - 1e-12:
        return "pass"
    return f"fail by {(-margin - interval.low) * 100:.1f} pts"


def gain_verdict(interval: Interval, target: float) -> str:
    """Dense's gain over its start against ``target``: met on the mean, and on the lower bound."""
    if math.isnan(interval.mean):
        return "-"
    if interval.mean < target:
        return f"not met (mean {target - interval.mean:.3f} short)"
    if math.isnan(interval.low) or interval.low < target:
        return "met on the mean, not the lower bound"
    return "met (lower bound too)"


def jitter_seed(*parts) -> int:
    """A stable seed for a bootstrap of one comparison (same table, same intervals)."""
    return random.Random("|".join(map(str, parts))).randrange(2 ** 31)
