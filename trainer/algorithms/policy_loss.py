"""PPO-style policy loss for GRPO: clipped surrogate (clip-higher, dual clip), KL loss to a
reference policy, entropy bonus, and loss aggregation that survives micro-batching.

Per response token t (mask m_t = 1), with r_t = exp(log π_θ − log π_old) and advantage A_t:

    pg_t  = max(−A_t·r_t, −A_t·clip(r_t, 1 − eps_clip, 1 + eps_clip_high))
    pg_t  = min(pg_t, −A_t·eps_clip_c)            if A_t < 0 and eps_clip_c is set (dual clip)
    pg_t *= w_t                                    sparse-rollout correction weight (detached)
    loss  = agg(pg) + kl_loss_coef·agg(kl(π_θ, π_ref)) − entropy_coef·agg(entropy)

(slime's total loss; the reference's §2.1 objective.) The correction weight multiplies the policy
term only; rejection acts through the mask, which applies to all three terms, as in the reference.

Aggregation modes (verl's ``loss_agg_mode``; slime's default reducer is ``seq_mean_token_mean``):

- ``token_mean``: Σ_{i,t} m·x / N_tokens
- ``seq_mean_token_mean``: Σ_i (Σ_t m·x / max(Σ_t m, 1)) / N_sequences
- ``seq_mean_token_sum_norm`` (Dr.GRPO): Σ_i (Σ_t m·x / L) / N_sequences, L a constant length

Micro-batching: N_tokens and N_sequences default to this call's own counts. When a global batch
is split into micro-batches whose gradients are accumulated, pass ``LossScale.for_batch(mask of
the whole global batch)`` to every micro-batch call: each call then returns its share, and the sum
over micro-batches equals the loss (and gradient) of the whole batch in one call. Sequences must
not be split across micro-batches (the per-sequence means need all of a sequence's tokens).
With data parallelism, count over all DP ranks' sequences and multiply by the DP size if the DDP
wrapper averages gradients over ranks (Megatron does unless ``calculate_per_token_loss``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.algorithms.kl import kl_estimate
# the config lives in settings.py (no torch: the flags read it); re-exported
from trainer.algorithms.settings import AGG_MODES, KL_TYPES, PolicyLossConfig  # noqa: F401

# exp() of a log ratio beyond ±20 is numerically meaningless (and can overflow in the product with
# the advantage); verl clamps the PPO log ratio to the same band.
_LOG_RATIO_BOUND = 20.0


@dataclass(frozen=True)
class LossScale:
    """Global denominators of the aggregation (None = use the current call's own counts).

    ``num_tokens``: loss-mask tokens in the global batch (``token_mean``); count the mask *after*
    rejection, i.e. the mask the loss is called with. ``num_sequences``: sequences in the global
    batch (``seq_mean_*``), including fully rejected ones (they contribute 0 but still count, as in
    slime's per-sample mean over the global batch).
    """

    num_tokens: float | None = None
    num_sequences: float | None = None

    @classmethod
    def for_batch(cls, loss_mask: torch.Tensor, num_sequences: int | None = None,
                  row_weights: torch.Tensor | None = None) -> "LossScale":
        """Denominators of a whole global batch given its [B, T] loss mask (rows = sequences).

        With ``row_weights`` [B] the counts are weighted (a row of weight w counts as w
        sequences), so weighted rows still average to the batch's loss."""
        if row_weights is not None:
            w = row_weights.float()
            return cls(num_tokens=float((loss_mask.bool().float() * w[:, None]).sum()),
                       num_sequences=float(w.sum()))
        return cls(num_tokens=float(loss_mask.bool().sum().item()),
                   num_sequences=float(loss_mask.shape[0] if num_sequences is None else num_sequences))


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, *, scale: LossScale | None = None,
              norm_length: int | None = None, row_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce per-token ``values`` [B, T] to a scalar (fp32); masked entries are ignored, even NaN.

    ``row_weights`` [B] weight whole rows (APR: each call of a trace counts 1 / its number of
    calls); the default denominators are then weighted counts, as in ``LossScale.for_batch``."""
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {AGG_MODES}")
    mask = mask.bool()
    if row_weights is not None and scale is None:
        scale = LossScale.for_batch(mask, row_weights=row_weights)
    scale = scale or LossScale()
    # where() rather than multiplication: padding may hold inf/NaN, and NaN·0 = NaN.
    v = torch.where(mask, values.float(), torch.zeros((), dtype=torch.float32, device=values.device))
    if row_weights is not None:
        v = v * row_weights.detach().float().to(v.device)[:, None]
    if mode == "token_mean":
        denom = scale.num_tokens if scale.num_tokens is not None else mask.sum().clamp_min(1)
        return v.sum() / denom
    seq_sums = v.sum(dim=-1)
    if mode == "seq_mean_token_mean":
        per_seq = seq_sums / mask.sum(dim=-1).clamp_min(1)
    else:
        if not norm_length:
            raise ValueError("seq_mean_token_sum_norm needs norm_length")
        per_seq = seq_sums / float(norm_length)
    num_seqs = scale.num_sequences if scale.num_sequences is not None else max(mask.shape[0], 1)
    return per_seq.sum() / num_seqs


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, cfg: PolicyLossConfig, *,
                mis_weights: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None,
                entropy: torch.Tensor | None = None, loss_scale: LossScale | None = None,
                row_weights: torch.Tensor | None = None, kl_coefs: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss (0-d fp32, differentiable w.r.t. ``logp`` and ``entropy``) and metrics.

    Shapes are [B, T]; ``advantages`` may also be [B] (broadcast over tokens). ``response_mask``
    is the loss mask (pass ``MISResult.loss_mask`` when the sparse correction is on, with
    ``mis_weights=MISResult.weights``). ``old_logp``, ``advantages``, ``mis_weights`` and
    ``ref_logp`` are treated as constants (detached).

    Metrics are detached 0-d fp32 tensors aggregated exactly like the loss (same mode, same
    ``loss_scale``), so summing a metric over the micro-batches of a global batch gives its
    global value: ``loss``, ``pg_loss``, ``kl_loss`` (when ``ref_logp`` is given), ``entropy``
    (when ``entropy`` is given), ``ppo_kl`` (mean log π_old − log π_θ), ``ratio_mean``,
    ``clipfrac``, ``clipfrac_high`` (A > 0, r > 1 + eps_high), ``clipfrac_low`` (A < 0,
    r < 1 − eps_clip), ``dual_clipfrac`` (A < 0 and the dual-clip bound is the active one).

    ``row_weights`` [B] weight every term of a row (see ``aggregate``); ``kl_coefs`` [B] replace
    ``cfg.kl_loss_coef`` row by row (Reasoning Cache: one coefficient for summary calls, another
    for thinking calls).
    """
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logp.device)

    def agg(x: torch.Tensor) -> torch.Tensor:
        return aggregate(x, mask, cfg.loss_agg_mode, scale=loss_scale,
                         norm_length=cfg.loss_agg_norm_length, row_weights=row_weights)

    logp32 = logp.float()
    adv = advantages.detach().float()
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp32)
    adv = torch.where(mask, adv, zero)
    log_ratio = torch.where(mask, logp32 - old_logp.detach().float(), zero)
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))

    lo, hi = 1.0 - cfg.eps_clip, 1.0 + cfg.clip_high
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(lo, hi)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    dual_active = torch.zeros_like(mask)
    if cfg.eps_clip_c is not None:
        # Dual clip bounds the loss of a negative-advantage token when r explodes (r > eps_clip_c).
        pg_dual = -adv * cfg.eps_clip_c
        dual_active = (adv < 0) & (pg > pg_dual)
        pg = torch.where(adv < 0, torch.minimum(pg, pg_dual), pg)
    if mis_weights is not None:
        pg = pg * torch.where(mask, mis_weights.detach().float(), zero)

    pg_loss = agg(pg)
    loss = pg_loss
    metrics: dict[str, torch.Tensor] = {}

    if ref_logp is not None:
        kl = kl_estimate(torch.where(mask, logp32, zero), torch.where(mask, ref_logp.detach().float(), zero),
                         cfg.kl_loss_type)
        kl_loss = agg(kl)
        if kl_coefs is not None:
            loss = loss + agg(kl * kl_coefs.detach().float().to(kl.device)[:, None])
        elif cfg.kl_loss_coef != 0.0:
            loss = loss + cfg.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    elif cfg.kl_loss_coef != 0.0 or (kl_coefs is not None and bool((kl_coefs != 0).any())):
        raise ValueError("a non-zero KL coefficient needs ref_logp")

    if entropy is not None:
        ent = agg(entropy)
        if cfg.entropy_coef != 0.0:
            loss = loss - cfg.entropy_coef * ent
        metrics["entropy"] = ent.detach()
    elif cfg.entropy_coef != 0.0:
        raise ValueError("entropy_coef != 0 needs entropy")

    with torch.no_grad():
        high = (adv > 0) & (ratio > hi)
        low = (adv < 0) & (ratio < lo)
        metrics.update(
            loss=loss.detach(),
            pg_loss=pg_loss.detach(),
            ppo_kl=agg(-log_ratio),
            ratio_mean=agg(ratio),
            clipfrac=agg((high | low).float()),
            clipfrac_high=agg(high.float()),
            clipfrac_low=agg(low.float()),
            dual_clipfrac=agg(dual_active.float()),
        )
    return loss, metrics
