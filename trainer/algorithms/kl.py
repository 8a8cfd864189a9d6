"""Per-token KL estimators between the learner π_θ and a reference policy.

All estimators take log-probabilities of the *sampled* token under both policies and return a
per-token estimate of KL(π_θ || π_ref) (Schulman's k1/k2/k3 family). They are computed in fp32
whatever the input dtype, because bf16 log-ratio differences of ~1e-3 are below bf16 resolution
near typical log-prob magnitudes.

Names follow slime's ``--kl-loss-type`` and verl's ``kl_loss_type``:

- ``k1``: log(π_θ/π_ref). Unbiased, high variance, can be negative per token.
- ``k2``: ½·log²(π_θ/π_ref). Biased, non-negative; its gradient is the k1 gradient scaled by the
  log ratio (verl calls it ``mse``).
- ``k3``: π_ref/π_θ − log(π_ref/π_θ) − 1. Unbiased, non-negative, low variance.
- ``low_var_kl``: k3 as verl/slime ship it: the log ratio is clamped to ±20 before exp (so one
  token cannot overflow) and the result to [−10, 10] (so one outlier cannot dominate the loss;
  its gradient is zero outside that band).
"""

from __future__ import annotations

import torch

from trainer.algorithms.settings import KL_TYPES

# verl clamps the log ratio inside low_var_kl to ±20 and the estimate to ±10.
_LOW_VAR_LOG_RATIO_BOUND = 20.0
_LOW_VAR_KL_BOUND = 10.0


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(π_θ || π_ref) estimate, fp32, same shape as ``logp``.

    Differentiable w.r.t. ``logp`` (and ``ref_logp`` if it requires grad, which it normally does
    not). Masking is the caller's job; with ``logp == ref_logp`` every estimator is exactly 0.
    """
    if kind not in KL_TYPES:
        raise ValueError(f"unknown kl type {kind!r}; expected one of {KL_TYPES}")
    log_ratio = logp.float() - ref_logp.float()  # log π_θ/π_ref
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    # k3 is written in terms of log(π_ref/π_θ) = -log_ratio.
    neg = -log_ratio
    if kind == "k3":
        return torch.exp(neg) - neg - 1.0
    neg = neg.clamp(-_LOW_VAR_LOG_RATIO_BOUND, _LOW_VAR_LOG_RATIO_BOUND)
    return (torch.exp(neg) - neg - 1.0).clamp(-_LOW_VAR_KL_BOUND, _LOW_VAR_KL_BOUND)
