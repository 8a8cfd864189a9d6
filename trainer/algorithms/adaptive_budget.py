"""An adaptive compression budget: the sampler's KV budget follows the measured mismatch.

After each rollout's dense recompute the trainer knows, for every sparse response token, the
ratio r_t = π_sampler(o_t) / π_dense(o_t). Its *low tail* is where compression hurts: tokens the
dense policy finds at least 1/bound times more likely than the sampler did (the sampler lost
context the token needed; with the reference bound 0.5 these are the tokens whose IS weight
π_dense/π_sampler exceeds 2 and gets truncated). The statistic is

    f = (sparse response tokens with r_t < bound) / (sparse response tokens)

which is the same test as "the f-quantile of log r_t is below log(bound)". The rule, applied
once per rollout (Sparrow-style multiplicative steps with a dead band, so it does not oscillate):

    f >  target                  ->  B := min(ceil(B * factor), max_budget)   (raise)
    f <  target * lower_below    ->  B := max(floor(B / factor), min_budget)  (lower)
    otherwise                    ->  B unchanged

starting at min_budget (the engines' --sglang-compress-max-prompt). The new B is sent with every
request of the next rollout (sglang-kvc's per-request ``compress_budget``); with asynchronous
rollouts, with the next rollout generated after the update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the flags build this config: no torch at import
    import torch


@dataclass(frozen=True)
class AdaptiveBudgetConfig:
    min_budget: int  # floor and starting budget
    max_budget: int  # ceiling
    ratio_bound: float = 0.5  # low tail: π_sampler / π_dense below this
    target: float = 0.01  # most low-tail token fraction tolerated before raising B
    factor: float = 1.25  # multiplicative step
    lower_below: float = 0.5  # lower B once the fraction is under target x this

    def __post_init__(self) -> None:
        if not 0 < self.min_budget <= self.max_budget:
            raise ValueError(f"need 0 < min budget {self.min_budget} <= max budget "
                             f"{self.max_budget}")
        if not 0 < self.ratio_bound < 1:
            raise ValueError(f"the ratio bound must be in (0, 1), got {self.ratio_bound}")
        if not 0 < self.target < 1 or not 0 <= self.lower_below < 1:
            raise ValueError("need 0 < target < 1 and 0 <= lower_below < 1")
        if self.factor <= 1:
            raise ValueError(f"the budget factor must be > 1, got {self.factor}")


def low_tail_fraction(dense_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                      bound: float) -> float:
    """Fraction of the masked tokens ([B, T]) whose π_sampler / π_dense is below ``bound``."""
    mask = mask.bool()
    count = int(mask.sum())
    if count == 0:
        return 0.0
    low = (sampler_logp.float() - dense_logp.float()) < math.log(bound)
    return float((low & mask).sum()) / count


class BudgetController:
    """The current budget and its rule; ``cfg`` None: off (requests carry no budget)."""

    def __init__(self, cfg: AdaptiveBudgetConfig | None):
        self.cfg = cfg
        self.budget = cfg.min_budget if cfg is not None else None

    @property
    def enabled(self) -> bool:
        return self.cfg is not None

    def next_budget(self, fraction: float) -> int:
        c, b = self.cfg, self.budget
        if fraction > c.target:
            return min(math.ceil(b * c.factor), c.max_budget)
        if fraction < c.target * c.lower_below:
            return max(math.floor(b / c.factor), c.min_budget)
        return b

    def observe(self, fraction: float) -> dict:
        """One rollout's low-tail fraction: moves the budget; returns what to log."""
        if not self.enabled:
            return {}
        self.budget = self.next_budget(fraction)
        return {"rollout/sampler_low_tail_fraction": fraction,
                "rollout/compress_budget_next": float(self.budget)}

    def load(self, budget: int | None) -> None:
        """A resumed run continues from its checkpoint's budget (within the bounds)."""
        if self.enabled and budget is not None:
            self.budget = min(max(int(budget), self.cfg.min_budget), self.cfg.max_budget)
