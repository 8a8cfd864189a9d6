"""benchmarks/grid/stats.py: the paired intervals and verdicts against hand-computed values."""

from __future__ import annotations

import math

import pytest
from benchmarks.grid import stats


def test_t_interval_by_hand():
    """Differences 0.1, 0.2, 0.3, 0.0, -0.1: mean 0.1, s = sqrt(0.1 / 4) = 0.158114, s.e. 0.070711,
    t(0.975, 4) = 2.7764 -> half-width 0.196322. Mutation check: n instead of n - 1 in the
    variance gives 0.175594 and fails."""
    i = stats.t_interval([0.1, 0.2, 0.3, 0.0, -0.1])
    assert i.mean == pytest.approx(0.1) and i.n == 5
    assert (i.low, i.high) == (pytest.approx(0.1 - 0.196322, abs=1e-6), pytest.approx(0.1 + 0.196322, abs=1e-6))
    one = stats.t_interval([0.4, math.nan])
    assert one.mean == 0.4 and math.isnan(one.low) and one.n == 1
    assert math.isnan(stats.t_interval([]).mean)


def test_t_quantiles():
    # the table's ends and the expansion beyond it against published values (t(0.975, 40) = 2.0211,
    # t(0.975, 120) = 1.9799)
    assert stats.t975(1) == 12.7062 and stats.t975(30) == 2.0423
    assert stats.t975(40) == pytest.approx(2.0211, abs=2e-4) and stats.t975(120) == pytest.approx(1.9799, abs=1e-4)
    with pytest.raises(ValueError):
        stats.t975(0)


def test_bootstrap_interval():
    """Constant differences: the interval is the point. 0/1 differences, 1,000 of them, p = 0.3:
    the bootstrap mean is ~normal with s.d. sqrt(0.21 / 1000) = 0.01449, so the 95% interval is
    0.3 -+ 0.0284 (within 10%). Same seed, same interval."""
    flat = stats.bootstrap_interval([0.05] * 40)
    assert (flat.mean, flat.low, flat.high) == (pytest.approx(0.05), pytest.approx(0.05), pytest.approx(0.05))
    values = [1.0] * 300 + [0.0] * 700
    i = stats.bootstrap_interval(values, seed=3)
    assert i.mean == pytest.approx(0.3) and i.n == 1000
    assert i.high - i.mean == pytest.approx(1.96 * math.sqrt(0.21 / 1000), rel=0.1)
    assert i.mean - i.low == pytest.approx(1.96 * math.sqrt(0.21 / 1000), rel=0.1)
    assert stats.bootstrap_interval(values, seed=3) == i


def test_pairing_by_seed_and_prompt():
    config, dense = {1: 0.5, 2: 0.7, 3: 0.2}, {1: 0.6, 2: 0.6, 4: 0.9}
    assert stats.paired_differences(config, dense) == [pytest.approx(-0.1), pytest.approx(0.1)]
    prompts = stats.prompt_differences({1: [1.0, 0.5], 2: [0.0, 0.0], 3: [1.0]},
                                       {1: [0.5, 0.5], 2: [1.0, 0.25], 3: [1.0, 1.0]})
    assert prompts == [0.5, 0.0, -1.0, -0.25]  # seed 3's lengths differ: left out


def test_verdicts():
    assert stats.verdict(stats.Interval(-0.01, -0.03, 0.01, 5), stats.MARGIN) == "pass"
    assert stats.verdict(stats.Interval(-0.02, -0.052, 0.01, 5), stats.MARGIN) == "fail by 2.2 pts"
    assert stats.verdict(stats.Interval(0.0, math.nan, math.nan, 1), stats.MARGIN).startswith("-")
    assert stats.gain_verdict(stats.Interval(0.2, 0.16, 0.24, 5), 0.15) == "met (lower bound too)"
    assert stats.gain_verdict(stats.Interval(0.2, 0.1, 0.3, 5), 0.15) == "met on the mean, not the lower bound"
    assert stats.gain_verdict(stats.Interval(0.1, 0.0, 0.2, 5), 0.15).startswith("not met (mean 0.050 short")
