"""The correction of a rollout in which some samples were generated dense (dense share).

With ``--n-dense-samples-per-prompt m`` the first m of each prompt's n samples are generated
with the whole KV cache (sglang-kvc's per-request ``compress: false``): their sampler is the
dense policy, π_sampler == π_old up to numerics, so their importance weight is exactly 1 and
they are never rejected or vetoed. The correction (``correction.compute_mis_weights``) is run
on the sparse samples' tokens only: its ratios, rejections, veto, batch normalisation (mean
weight 1 over sparse tokens) and every metric it reports are over sparse tokens.

How the mixed group is weighted: the group's baseline (GRPO mean / std, RLOO) is over all n
samples, dense and sparse alike; in the loss each sample is one sample, as without dense share
(the loss aggregation does not tell them apart), a dense token with weight 1, a sparse one with
its corrected IS weight. Each sample's gradient term estimates the dense policy's gradient on its
own (the dense ones exactly, the sparse ones through their weight), so the mix needs no
reweighting.
"""

from __future__ import annotations

import torch

from .correction import CorrectionConfig, MISResult, compute_mis_weights


def correct_with_dense_rows(old_logp: torch.Tensor | None, rollout_logp: torch.Tensor,
                            mask: torch.Tensor, dense: torch.Tensor | None,
                            cfg: CorrectionConfig) -> MISResult:
    """``compute_mis_weights`` over the sparse rows; ``dense`` [B] bool rows get weight 1 and
    keep their whole response mask. ``dense`` None (or all False): the plain correction."""
    if dense is None or not bool(dense.any()):
        return compute_mis_weights(old_logp, rollout_logp, mask, cfg)
    dense_tok = mask.bool() & dense.bool()[:, None]
    mis = compute_mis_weights(old_logp, rollout_logp, mask.bool() & ~dense_tok, cfg)
    weights = torch.where(dense_tok, torch.ones_like(mis.weights), mis.weights)
    metrics = dict(mis.metrics)
    metrics["dense_token_fraction"] = float(dense_tok.sum()) / max(1, int(mask.sum()))
    return MISResult(weights, mis.loss_mask | dense_tok, metrics)


def sparse_rows_mask(mask: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
    """The response mask of the sparse samples only."""
    return mask if dense is None else mask & ~dense.bool()[:, None]
