"""The adaptive budget's rule on a fake sequence of mismatch measurements, its statistic against
a hand count, and its flags."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.adaptive_budget import (AdaptiveBudgetConfig, BudgetController,
                                                low_tail_fraction)


def test_low_tail_fraction_is_a_hand_count():
    dense = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.2, 0.2, 0.2, 0.2]]))
    sampler = torch.log(torch.tensor([[0.2, 0.3, 0.5, 0.01], [0.05, 0.2, 0.9, 0.9]]))
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    # ratios 0.4 0.6 1.0 | 0.25 1.0 4.5 4.5 (the masked 0.02 does not count): 2 of 7 below 0.5
    assert low_tail_fraction(dense, sampler, mask, 0.5) == pytest.approx(2 / 7)
    assert low_tail_fraction(dense, sampler, mask, 0.3) == pytest.approx(1 / 7)
    assert low_tail_fraction(dense, sampler, torch.zeros_like(mask), 0.5) == 0.0


def test_controller_moves_as_documented():
    c = BudgetController(AdaptiveBudgetConfig(min_budget=128, max_budget=300, target=0.02,
                                              factor=1.25, lower_below=0.5))
    assert c.budget == 128  # starts at the floor
    # fractions: worse than target -> up; inside [0.01, 0.02] -> stay; under 0.01 -> down
    seen = []
    for f in [0.05, 0.03, 0.015, 0.2, 0.2, 0.2, 0.01, 0.005, 0.0, 0.0, 0.0, 0.0]:
        seen.append(c.observe(f)["rollout/compress_budget_next"])
    assert seen == [160, 200, 200, 250, 300, 300, 300, 240, 192, 153, 128, 128]
    assert [math.ceil(128 * 1.25), math.ceil(250 * 1.25)] == [160, 313]  # 313 capped to 300
    c.load(1000)
    assert c.budget == 300  # a checkpoint's budget, clamped to the bounds
    off = BudgetController(None)
    assert not off.enabled and off.observe(0.5) == {} and off.budget is None


def test_config_is_validated():
    for bad in (dict(min_budget=0, max_budget=10), dict(min_budget=20, max_budget=10),
                dict(min_budget=8, max_budget=10, ratio_bound=1.5),
                dict(min_budget=8, max_budget=10, factor=1.0),
                dict(min_budget=8, max_budget=10, target=0.0)):
        with pytest.raises(ValueError):
            AdaptiveBudgetConfig(**bad)


@pytest.fixture
def flags(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return ["--hf-checkpoint", str(tmp_path), "--prompt-data", _prompt_file(tmp_path)]


def test_flags_reach_the_plan_and_bad_combinations_fail(flags):
    from trainer.arguments import parse_args
    from trainer.rollout.config import rollout_setup_from_args

    rkv = ["--sglang-compress-algorithm", "rkv", "--sglang-compress-max-prompt", "192"]
    plan = rollout_setup_from_args(parse_args([*flags, *rkv, "--adaptive-budget-max", "320",
                                               "--adaptive-budget-target", "0.02"])).plan
    assert plan.adaptive == AdaptiveBudgetConfig(192, 320, 0.5, 0.02, 1.25, 0.5)
    assert rollout_setup_from_args(parse_args([*flags, *rkv])).plan.adaptive is None
    for extra in (["--adaptive-budget-max", "320"],  # no compression
                  [*rkv, "--adaptive-budget-max", "100"],  # max below the engines' budget
                  [*rkv, "--adaptive-budget-max", "320", "--mis-bypass"],
                  [*rkv, "--adaptive-budget-max", "320", "--sparse-recompute"]):
        with pytest.raises(SystemExit):
            parse_args([*flags, *extra])


def _prompt_file(tmp_path) -> str:
    """--prompt-data must name a file that exists (checked when the flags are parsed)."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "p", "label": "1"}\n')
    return str(path)
