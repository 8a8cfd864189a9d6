"""Advantage estimators for outcome-reward RL on padded response batches.

Inputs are one scalar reward per response (``rewards[B]``) and the response mask ``[B, T]``;
output is a token-level advantage ``[B, T]`` (fp32, zero wherever the mask is 0).

Estimators (names as slime's ``--advantage-estimator`` / verl's ``adv_estimator``):

- ``grpo``: (r − mean_g r) / (std_g r + eps), broadcast to every token. std is the *unbiased*
  (Bessel-corrected) group std, which is what ``torch.std`` gives and what slime and verl use;
  eps = 1e-6 as in the reference. ``std_normalize=False`` is slime's
  ``--disable-grpo-std-normalization`` (the same as ``dr_grpo``).
- ``dr_grpo``: r − mean_g r (Dr.GRPO removes the std division).
- ``rloo``: r − mean of the *other* samples of the group (leave-one-out baseline).
- ``reinforce_plus_plus``: token rewards (the reward sits on the last response token, minus an
  optional per-token penalty such as a KL-in-reward term) -> discounted returns
  G_t = Σ_{k≥t} γ^(k−t) r_k, then whitened over all response tokens of the batch.
- ``reinforce_plus_plus_baseline``: (r − mean_g r) broadcast to tokens, then whitened over all
  response tokens of the batch.

Groups are the samples of one prompt, given either as ``group_index[B]`` (any integer labels) or
as contiguous blocks of ``n_samples_per_prompt``. A group of one sample has no baseline: its
advantage is 0 for every group-based estimator (slime subtracts the mean, which leaves 0; verl
would keep the raw reward instead). Batch whitening is over whatever batch is passed in, so call
this once on the whole rollout batch (all DP ranks' samples), not per micro-batch.
"""

from __future__ import annotations

import torch

# the config without torch (the flags read its defaults); handed on here
from trainer.algorithms.settings import ESTIMATORS, AdvantageConfig  # noqa: F401


def advantages_for(cfg: AdvantageConfig, rewards, response_mask, *, group_index=None,
                   n_samples_per_prompt=None, token_level_penalty=None) -> torch.Tensor:
    """``compute_advantages`` with the estimator and its settings from ``cfg``."""
    return compute_advantages(
        cfg.estimator, rewards, response_mask,
        group_index=group_index, n_samples_per_prompt=n_samples_per_prompt,
        std_normalize=cfg.std_normalize, eps=cfg.eps, gamma=cfg.gamma,
        token_level_penalty=token_level_penalty,
    )


def resolve_group_index(batch_size: int, *, group_index=None, n_samples_per_prompt=None,
                        device=None) -> torch.Tensor:
    """Dense group ids 0..G-1 of shape [B] from either form of group description."""
    if (group_index is None) == (n_samples_per_prompt is None):
        raise ValueError("pass exactly one of group_index or n_samples_per_prompt")
    if group_index is not None:
        group_index = torch.as_tensor(group_index, device=device)
        if group_index.shape != (batch_size,):
            raise ValueError(f"group_index must have shape [{batch_size}], got {tuple(group_index.shape)}")
        return torch.unique(group_index, return_inverse=True)[1]
    n = int(n_samples_per_prompt)
    if n < 1 or batch_size % n:
        raise ValueError(f"batch size {batch_size} is not a multiple of n_samples_per_prompt={n}")
    return torch.arange(batch_size, device=device) // n


def _group_stats(rewards: torch.Tensor, gid: torch.Tensor):
    """Per-sample group size, group mean and unbiased group std (0 for singleton groups)."""
    num_groups = int(gid.max().item()) + 1
    count = torch.zeros(num_groups, dtype=torch.float32, device=rewards.device).index_add_(
        0, gid, torch.ones_like(rewards))
    total = torch.zeros(num_groups, dtype=torch.float32, device=rewards.device).index_add_(0, gid, rewards)
    mean = total / count
    sq_dev = torch.zeros(num_groups, dtype=torch.float32, device=rewards.device).index_add_(
        0, gid, (rewards - mean[gid]).square())
    # Bessel correction; a singleton has no spread (its centred reward is 0 anyway).
    var = torch.where(count > 1, sq_dev / (count - 1).clamp_min(1), torch.zeros_like(sq_dev))
    return count[gid], mean[gid], var.sqrt()[gid]


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) / sqrt(var + eps) over the masked entries; unbiased variance; 0 off the mask."""
    n = mask.sum()
    mean = (values * mask).sum() / n.clamp_min(1)
    var = ((values - mean).square() * mask).sum() / (n - 1).clamp_min(1)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def discounted_returns(token_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + γ·G_{t+1} along the last dim (positions past the end contribute nothing)."""
    if gamma == 1.0:  # undiscounted: a reverse cumulative sum, no Python loop over T
        return token_rewards.flip(-1).cumsum(-1).flip(-1)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in each row of the mask (rows without any 1 give -1)."""
    T = response_mask.shape[1]
    positions = torch.arange(T, device=response_mask.device).expand_as(response_mask)
    return torch.where(response_mask, positions, torch.full_like(positions, -1)).max(dim=1).values


def compute_advantages(estimator: str, rewards: torch.Tensor, response_mask: torch.Tensor, *,
                       group_index=None, n_samples_per_prompt=None, std_normalize: bool = True,
                       eps: float = 1e-6, gamma: float = 1.0,
                       token_level_penalty: torch.Tensor | None = None) -> torch.Tensor:
    """Token-level advantages ``[B, T]`` (fp32, zeros off the mask).

    ``token_level_penalty`` ([B, T], e.g. kl_coef·KL(π_old‖π_ref) per token) is subtracted from the
    token rewards; only ``reinforce_plus_plus`` has token rewards, so other estimators reject it.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {ESTIMATORS}")
    mask = response_mask.bool()
    maskf = mask.float()
    r = rewards.detach().float().reshape(-1)
    B = mask.shape[0]
    if r.shape[0] != B:
        raise ValueError(f"rewards has {r.shape[0]} entries, response_mask has {B} rows")
    if token_level_penalty is not None and estimator != "reinforce_plus_plus":
        raise ValueError("token_level_penalty is only used by reinforce_plus_plus")

    if estimator == "reinforce_plus_plus":
        last = last_token_index(mask)
        token_rewards = torch.zeros_like(maskf)
        has_tokens = last >= 0
        rows = torch.arange(B, device=mask.device)[has_tokens]
        token_rewards[rows, last[has_tokens]] = r[has_tokens]
        if token_level_penalty is not None:
            token_rewards = token_rewards - torch.where(mask, token_level_penalty.detach().float(), 0.0)
        return masked_whiten(discounted_returns(token_rewards, gamma) * maskf, maskf)

    gid = resolve_group_index(B, group_index=group_index, n_samples_per_prompt=n_samples_per_prompt,
                              device=mask.device)
    count, mean, std = _group_stats(r, gid)
    if estimator == "grpo":
        adv = r - mean
        if std_normalize:
            adv = adv / (std + eps)
    elif estimator == "dr_grpo":
        adv = r - mean
    elif estimator == "rloo":
        # r_i − (Σ_g r − r_i)/(n − 1) = n/(n − 1)·(r_i − mean); 0 for a singleton.
        adv = torch.where(count > 1, (r - mean) * count / (count - 1).clamp_min(1), torch.zeros_like(r))
    else:  # reinforce_plus_plus_baseline
        return masked_whiten((r - mean)[:, None] * maskf, maskf)
    return adv[:, None] * maskf
