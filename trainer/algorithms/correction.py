"""Sparse-rollout mismatch correction: importance weights π_old/π_sparse, rejection, veto.

Three policies (decoupled PPO): π_sparse samples the rollout (the server's logprobs, computed over
a compressed KV cache), π_old is the dense recompute of the same weights before the update, π_θ is
the learner. PPO clipping handles π_θ/π_old; this module handles ρ_t = π_old(o_t)/π_sparse(o_t).
The semantics follow the reference's slime helper (sparse_rl.md §2, ``mis.py`` + ``mis.yaml``):

1. log ratio lr_t = log π_old − log π_sparse on response tokens; the ratio at a *level* is
   ``token``: lr_t; ``sequence``: Σ_t lr_t (product of ratios); ``geometric``: mean_t lr_t,
   exponentiated after clamping the log to ±20 (the reference's SAFETY_BOUND).
2. IS weight (``use_mis``) by *mode*: ``truncate`` w = min(ρ, U); ``clip`` w = clamp(ρ, L, U);
   ``mask`` w = ρ but tokens with ρ outside [L, U] leave the loss mask. Weights are 0 on padding.
3. Rejection sampling (``use_rs``, its own level and bounds [L_rs, U_rs], defaulting to the IS
   bounds): tokens (or whole sequences, at sequence/geometric level) with ρ outside the bounds
   leave the loss mask. Their IS weights are kept (they only matter for batch normalisation).
4. Veto (``veto_threshold`` τ): a sequence with any response token whose *per-token* ratio is
   below τ (a "catastrophic" token the dense model finds ≥ 1/τ times less likely) leaves the loss
   mask entirely. The reference only vetoes when RS is on; here the veto has its own switch
   (τ = None disables it), which is the same for every configuration the reference can express.
5. Batch normalisation: w /= mean(w), the mean taken over all response tokens of the batch with
   the *original* response mask (token level), or over sequences of their (single) weight
   (sequence and geometric level; the reference only defines it for token and sequence level).
   Skipped when the mean is ≤ 1e-8. Normalisation runs over whatever batch is passed in: the
   reference normalised per training micro-batch; passing the whole global batch at once (the
   weights only depend on π_old and π_sparse, both fixed for the rollout) is the lower-variance
   choice and makes the result independent of how the batch is later split.
6. Bypass (slime ``--use-rollout-logprobs``, verl ``bypass_mode``): π_old := π_sparse, so there is
   nothing to correct: weights are 1, the mask is unchanged, and the PPO ratio uses the rollout
   logprobs (``select_old_logp``).

Defaults reproduce the reference's mis.yaml: token-level truncation at U = 1.5, token rejection
outside [0.5, 1.5], veto 1e-4, batch-normalised weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

# the config and its presets live in settings.py (no torch: the flags read them); re-exported
from trainer.algorithms.settings import (LEVELS, MODES, PRESETS, CorrectionConfig,  # noqa: F401
                                         correction_preset)

# Bound on |log ratio| before exp(), as in the reference (exp(20) ~ 4.9e8 is still finite in fp32).
SAFETY_BOUND = 20.0
# The reference skips batch normalisation when the mean weight is this small.
_MIN_NORM_MEAN = 1e-8


@dataclass
class MISResult:
    weights: torch.Tensor  # [B, T] fp32, detached; multiply the per-token policy loss (0 on padding)
    loss_mask: torch.Tensor  # [B, T] bool: response_mask minus rejected / vetoed tokens
    metrics: dict[str, float] = field(default_factory=dict)


def select_old_logp(old_logp: torch.Tensor | None, rollout_logp: torch.Tensor,
                    cfg: CorrectionConfig) -> torch.Tensor:
    """The π_old anchor for the PPO ratio: the rollout logprobs in bypass mode, else the recompute."""
    if cfg.bypass:
        return rollout_logp
    if old_logp is None:
        raise ValueError("old_logp (dense recompute) is required unless bypass is on")
    return old_logp


def _level_log_ratio(log_ratio: torch.Tensor, maskf: torch.Tensor, level: str) -> torch.Tensor:
    """Log ratio at the given level, broadcast to [B, T] (log_ratio is already 0 off the mask)."""
    if level == "token":
        return log_ratio
    seq = log_ratio.sum(dim=-1, keepdim=True)
    if level == "geometric":
        seq = seq / maskf.sum(dim=-1, keepdim=True).clamp_min(1)
    return seq.expand_as(log_ratio)


def _ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))


def mismatch_metrics(old_logp: torch.Tensor, rollout_logp: torch.Tensor,
                     response_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Diagnostics of π_sparse vs π_old as 0-d tensors (token means over response tokens; the
    per-sequence ones are means over sequences with at least one response token).

    kl: KL(π_sparse‖π_old) direct, mean(log π_sparse − log π_old); k3_kl: mean(ρ − log ρ − 1);
    chi2_token: mean(ρ_t²) − 1; chi2_seq: mean_i(Π_t ρ_t)² − 1; training_ppl / rollout_ppl:
    per-sequence exp(mean NLL) under π_old / π_sparse; log_ppl_diff (and _abs): per-sequence
    mean log π_sparse − mean log π_old; ppl_ratio: per-sequence training_ppl / rollout_ppl.
    """
    mask = response_mask.bool()
    maskf = mask.float()
    zero = torch.zeros((), dtype=torch.float32, device=mask.device)
    old = torch.where(mask, old_logp.detach().float(), zero)
    roll = torch.where(mask, rollout_logp.detach().float(), zero)
    lr = old - roll
    n_tok = maskf.sum().clamp_min(1)
    seq_len = maskf.sum(dim=-1)
    has_tokens = (seq_len > 0).float()
    n_seq = has_tokens.sum().clamp_min(1)

    def tok_mean(x):
        return (x * maskf).sum() / n_tok

    def seq_mean(x):
        return (x * has_tokens).sum() / n_seq

    lr_safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_lr = lr.sum(dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    mean_old = old.sum(dim=-1) / seq_len.clamp_min(1)
    mean_roll = roll.sum(dim=-1) / seq_len.clamp_min(1)
    log_ppl_diff = mean_roll - mean_old
    return {
        "kl": tok_mean(-lr),
        "k3_kl": tok_mean(torch.exp(lr_safe) - lr_safe - 1.0),
        "chi2_token": tok_mean(torch.exp(2.0 * lr_safe)) - 1.0,
        "chi2_seq": seq_mean(torch.exp(2.0 * seq_lr)) - 1.0,
        "training_ppl": seq_mean(torch.exp(-mean_old)),
        "rollout_ppl": seq_mean(torch.exp(-mean_roll)),
        "log_ppl_diff": seq_mean(log_ppl_diff),
        "log_ppl_abs_diff": seq_mean(log_ppl_diff.abs()),
        "ppl_ratio": seq_mean(torch.exp(log_ppl_diff)),
    }


def row_correction(old_logp: torch.Tensor, rollout_logp: torch.Tensor, response_mask: torch.Tensor,
                   cfg: CorrectionConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """IS weights *before* batch normalisation and the corrected loss mask, for any rows of a
    batch: everything here is per token or per sequence, so a micro-batch of whole sequences
    gets exactly the values the whole batch would (the normaliser is ``compute_mis_weights``')."""
    return _per_row_correction(old_logp, rollout_logp, response_mask.bool(), cfg, {})


def _per_row_correction(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                        cfg: CorrectionConfig, stats: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 2-4 of the module docstring (IS weights, rejection, veto); fills ``stats``."""
    maskf = mask.float()
    zero = torch.zeros((), dtype=torch.float32, device=mask.device)
    lr = torch.where(mask, old_logp.detach().float() - rollout_logp.detach().float(), zero)
    n_tok = maskf.sum().clamp_min(1)

    def tok_frac(flags):
        return (flags & mask).float().sum() / n_tok

    weights = maskf.clone()
    loss_mask = mask.clone()
    stats.update(is_weight_mean_raw=zero + 1.0, truncated_fraction=zero, clipped_low_fraction=zero,
                 is_masked_fraction=zero, rs_rejected_fraction=zero, catastrophic_token_fraction=zero,
                 vetoed_seq_fraction=zero, batch_norm_factor=zero + 1.0)
    if cfg.bypass:
        return weights, loss_mask

    if cfg.use_mis:
        rho = _ratio(_level_log_ratio(lr, maskf, cfg.level))
        stats["is_weight_mean_raw"] = (rho * maskf).sum() / n_tok
        L, U = cfg.is_lower_bound, cfg.upper_bound
        if cfg.mode == "truncate":
            stats["truncated_fraction"] = tok_frac(rho > U)
            weights = rho.clamp(max=U)
        elif cfg.mode == "clip":
            stats["truncated_fraction"] = tok_frac(rho > U)
            stats["clipped_low_fraction"] = tok_frac(rho < L)
            weights = rho.clamp(L, U)
        else:  # mask: keep the weight, drop the token
            outside = (rho < L) | (rho > U)
            stats["is_masked_fraction"] = tok_frac(outside)
            loss_mask &= ~outside
            weights = rho
        weights = torch.where(mask, weights, zero)

    if cfg.use_rs:
        rho_rs = _ratio(_level_log_ratio(lr, maskf, cfg.rs_level))
        rejected = (rho_rs < cfg.rs_lower) | (rho_rs > cfg.rs_upper)
        stats["rs_rejected_fraction"] = tok_frac(rejected)
        loss_mask &= ~rejected

    if cfg.veto_threshold is not None:
        # Compared on the raw per-token log ratio, whatever the IS/RS level.
        catastrophic = mask & (lr < math.log(cfg.veto_threshold))
        vetoed = catastrophic.any(dim=-1)
        has_tokens = mask.any(dim=-1)
        stats["catastrophic_token_fraction"] = catastrophic.float().sum() / n_tok
        stats["vetoed_seq_fraction"] = vetoed.float().sum() / has_tokens.float().sum().clamp_min(1)
        loss_mask &= ~vetoed[:, None]
    return weights, loss_mask


def _batch_norm_factor(weights: torch.Tensor, maskf: torch.Tensor, level: str) -> torch.Tensor:
    """Step 5: the batch's mean weight (1 when it is too small to divide by)."""
    if level == "token":
        norm = (weights * maskf).sum() / maskf.sum().clamp_min(1)
    else:  # one weight per sequence: average the sequences' weights, not their tokens
        seq_len = maskf.sum(dim=-1)
        seq_w = (weights * maskf).sum(dim=-1) / seq_len.clamp_min(1)
        has_tokens = (seq_len > 0).float()
        norm = (seq_w * has_tokens).sum() / has_tokens.sum().clamp_min(1)
    return torch.where(norm > _MIN_NORM_MEAN, norm, torch.ones_like(norm))


def compute_mis_weights(old_logp: torch.Tensor | None, rollout_logp: torch.Tensor,
                        response_mask: torch.Tensor, cfg: CorrectionConfig) -> MISResult:
    """IS weights, the corrected loss mask and metrics (plain floats) for one batch [B, T].

    Metrics, besides ``mismatch_metrics``'s (all token fractions are over response tokens):
    ``is_weight_mean_raw`` (ρ at the IS level before bounds), ``is_weight_mean`` (final weights),
    ``batch_norm_factor`` (the divisor; 1 when off), ``truncated_fraction`` (ρ > U in truncate
    and clip modes), ``clipped_low_fraction`` (ρ < L in clip mode), ``is_masked_fraction`` (ρ
    outside [L, U] in mask mode), ``rs_rejected_fraction`` (outside the RS bounds),
    ``catastrophic_token_fraction`` (ratio < veto threshold), ``vetoed_seq_fraction`` (sequences
    vetoed, over sequences with response tokens), ``rejected_fraction`` (response tokens removed
    from the loss mask by any cause), ``ess`` (effective sample size (Σw)²/(NΣw²) ∈ (0, 1] of the
    weights the loss actually applies, w·loss_mask, over the N response tokens).
    """
    mask = response_mask.bool()
    maskf = mask.float()
    zero = torch.zeros((), dtype=torch.float32, device=mask.device)
    if old_logp is None:
        if not cfg.bypass:
            raise ValueError("old_logp (dense recompute) is required unless bypass is on")
        old_logp = rollout_logp  # bypass: π_old is π_sparse
    diag = mismatch_metrics(old_logp, rollout_logp, mask)
    n_tok = maskf.sum().clamp_min(1)
    stats: dict[str, torch.Tensor] = {}
    weights, loss_mask = _per_row_correction(old_logp, rollout_logp, mask, cfg, stats)
    if cfg.needs_batch_normalizer:
        norm = _batch_norm_factor(weights, maskf, cfg.level)
        weights = weights / norm
        stats["batch_norm_factor"] = norm

    final_w = torch.where(loss_mask, weights, zero)
    sq_sum = final_w.square().sum()
    stats["ess"] = torch.where(sq_sum > 0, final_w.sum().square() / (n_tok * sq_sum).clamp_min(1e-30), zero)
    stats["is_weight_mean"] = (weights * maskf).sum() / n_tok
    stats["rejected_fraction"] = (maskf.sum() - loss_mask.float().sum()) / n_tok

    names = list(diag) + list(stats)
    values = torch.stack([diag[k].float() for k in diag] + [torch.as_tensor(stats[k]).float() for k in stats])
    metrics = dict(zip(names, values.tolist()))  # one host sync for all metrics
    return MISResult(weights=weights.detach(), loss_mask=loss_mask.detach(), metrics=metrics)
