"""A rollout's rewards as training sees them (evaluation never comes here): the user's bias and
scaling, DAPO's soft over-long penalty, and which samples over-long filtering keeps in the loss.

    shaped = training_rewards(result.traces, plan)
    shaped.rewards   # [num_traces]: (reward + penalty + bias) x scaling
    shaped.keep      # [num_calls] bool, or None: every call stays in the loss
"""

from __future__ import annotations

import dataclasses

import torch

from ...algorithms.overlong import keep_rows, overlong_penalty
from .traces import Trace


@dataclasses.dataclass
class ShapedRewards:
    rewards: torch.Tensor  # [num_traces]
    keep: torch.Tensor | None  # [num_calls] calls that stay in the loss; None = all
    metrics: dict


def training_rewards(traces: list[Trace], plan) -> ShapedRewards:
    """``plan`` is the run's ``RolloutPlan`` (bias, scaling, over-long shaping, max length)."""
    raw = torch.tensor([t.reward for t in traces], dtype=torch.float32)
    # the answer is the trace's last call: its length is what the over-long penalty reads
    lengths = torch.tensor([len(t.calls[-1].gen.response_ids) for t in traces])
    penalty = overlong_penalty(lengths, plan.sampling.max_response_len, plan.overlong)
    truncated = [c.gen.finish_reason == "length" for t in traces for c in t.calls]
    keep = keep_rows(truncated, plan.overlong)
    shaped = (raw + penalty + plan.reward_bias) * plan.reward_scaling
    return ShapedRewards(shaped, keep, _metrics(penalty, keep, truncated, plan.overlong))


def _metrics(penalty: torch.Tensor, keep, truncated: list[bool], cfg) -> dict:
    out = {}
    if cfg.penalizes:
        out["rollout/overlong_penalty_mean"] = float(penalty.mean())
        out["rollout/overlong_penalized_fraction"] = float((penalty < 0).float().mean())
    if cfg.filtering:
        out["rollout/overlong_filtered"] = float(sum(truncated)) if keep is not None else 0.0
    return out
