"""The claim's docs come from the data (benchmarks/grid/claim.py, issue 69)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.grid import claim, stats

ROOT = Path(__file__).resolve().parents[3]


def _row(mean: float, low: float, high: float, seeds: int = 5) -> claim.Row:
    interval = stats.Interval(mean, low, high, seeds)
    return claim.Row("rkv:128:sparse_rl", seeds, stats.Interval(0.4, 0.38, 0.42, seeds), 0.42,
                     interval, interval, None)


@pytest.mark.parametrize("low, high, decision", [
    (-0.029, 0.01, "non-inferior"),  # the low end clears -3 points
    (-0.06, -0.031, "inferior"),  # the whole interval is below -3 points
    (-0.038, -0.002, "undecided at 5 seeds"),  # it holds -3 points: more seeds decide
])
def test_the_decision_follows_the_interval_against_three_points(low, high, decision):
    assert _row((low + high) / 2, low, high).decision == decision


def test_one_seed_has_no_decision():
    assert _row(-0.01, math.nan, math.nan, seeds=1).decision == "needs >= 2 seeds"


def test_points_are_hundredths_of_accuracy():
    assert claim.points(stats.Interval(-0.0204, -0.0381, -0.0027, 5)) == "-2.0 [-3.8, -0.3]"


def test_a_block_is_replaced_between_its_markers_only():
    text = "a\n<!-- claim:readme -->\nold\nlines\n<!-- /claim:readme -->\nb\n"
    assert claim.replace_block(text, "readme", "new") == "a\n<!-- claim:readme -->\nnew\n<!-- /claim:readme -->\nb\n"
    with pytest.raises(ValueError, match="claim:training"):
        claim.replace_block(text, "training", "x")


def test_the_docs_carry_what_the_data_gives():
    """README.md, docs/training.md and docs/benchmarks.md hold exactly the blocks that
    docs/data/issue61 regenerates: a run added without `--write` fails here."""
    for name, body in claim.blocks(ROOT / "docs" / "data" / "issue61").items():
        text = (ROOT / claim.TARGETS[name]).read_text()
        assert f"<!-- claim:{name} -->\n{body}\n<!-- /claim:{name} -->" in text, (
            f"{claim.TARGETS[name]}: stale; run python -m benchmarks.grid.claim docs/data/issue61 --write")
