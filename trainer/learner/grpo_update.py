"""One rollout's policy update: rewards -> advantages, dense π_old recompute, sparse-rollout
correction, then optimizer steps over global batches.

Everything that needs the whole batch (group statistics, importance-weight normalisation, loss
denominators) is computed once on the full rollout, replicated on every rank; the train step
then only slices rows for its micro-batches, so results do not depend on how samples are split
across micro-batches or data-parallel ranks.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch
import torch.distributed as dist


from ..algorithms import (AdvantageConfig, CorrectionConfig, LossScale, PolicyLossConfig,
                         advantages_for, policy_loss, row_correction, select_old_logp)
from ..algorithms.dense_share import correct_with_dense_rows, sparse_rows_mask
from ..launch import default_device
from .packing import Sample
from .policy_trainer import ResponseRows
from .transfer import to_device_together


@dataclasses.dataclass
class RolloutBatch:
    """A rollout's trained samples (LM calls) in global order, and the traces they belong to.

    A trace is what gets a reward and an advantage; by default every sample is its own trace
    and the groups are blocks of ``n_samples_per_prompt``. A generate plug-in may give several
    calls per trace (APR: parent and child threads share the trace's advantage) and its own
    groups (Reasoning Cache: the samples conditioned on one summary)."""

    samples: list[Sample]
    rewards: torch.Tensor  # [num_traces]
    rollout_logp: list[torch.Tensor]  # π_sparse, per sample [R_i] (from the rollout server)
    n_samples_per_prompt: int | None = None  # groups = contiguous blocks of traces
    group_index: list | None = None  # [num_traces] group label of each trace, instead
    trace_index: list[int] | None = None  # [B] the trace of each sample; None = sample i is trace i
    loss_weights: list[float] | None = None  # [B] row weight in the loss (None = all 1)
    kl_coefs: list[float] | None = None  # [B] per-row KL coefficient (None = --kl-loss-coef)
    keep: torch.Tensor | None = None  # [B] bool rows that stay in the loss (over-long filtering)
    # [B] bool rows sampled with the whole KV (dense share): IS weight 1, outside the correction
    dense: torch.Tensor | None = None
    # how many versions its samples may lag the weights they train (None: on-policy)
    max_staleness: int | None = None
    # its generation's seconds and GPUs (None: not known), for ``perf/generate_*``
    generation_seconds: float = 0.0
    generation_gpus: int | None = None

    @property
    def num_traces(self) -> int:
        return len(self.rewards)

    def trace_of_sample(self) -> torch.Tensor:
        if self.trace_index is None:
            return torch.arange(len(self.samples))
        return torch.tensor(self.trace_index, dtype=torch.long)


def pad_rows(rows: list[torch.Tensor], width: int | None = None) -> torch.Tensor:
    """Right-pad 1-D tensors into ``[B, width]`` (zeros)."""
    width = width or max(len(r) for r in rows)
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r.float()
    return out


def response_mask(samples: list[Sample], width: int) -> torch.Tensor:
    """[B, width] bool: the tokens that enter the loss, advantages, correction and mismatch
    metrics: every response token, less a multi-turn sample's observations (``loss_mask``)."""
    lengths = torch.tensor([len(s.response_ids) for s in samples])
    mask = torch.arange(width)[None, :] < lengths[:, None]
    for i, s in enumerate(samples):
        if s.loss_mask is not None:
            mask[i, :len(s.loss_mask)] &= torch.tensor(s.loss_mask, dtype=torch.bool)
    return mask


def gather_dp(values: list[torch.Tensor | None], trainer) -> list[torch.Tensor]:
    """Fill a per-sample list that each DP rank computed for its own samples (None elsewhere;
    also None on pipeline stages other than the last), gathering over all ranks."""
    if dist.get_world_size() == 1:
        return values  # type: ignore[return-value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, values)
    merged = list(values)
    for part in gathered:
        for i, v in enumerate(part):
            if v is not None:
                merged[i] = v
    return merged  # type: ignore[return-value]


@dataclasses.dataclass
class PreparedUpdate:
    """Per-token tensors ``[B, T]`` of the whole rollout, shared by all its optimizer steps.

    Fused (``fused_old_logp.py``): ``old_logp`` and ``weights`` are None and ``loss_mask`` lacks
    the correction's rejections until the update's forward gives π_old; each micro-batch then
    corrects its own rows from ``rollout_logp`` and ``response_mask``, and the step fills the
    three fields and the correction's ``metrics`` in place."""

    advantages: torch.Tensor
    old_logp: torch.Tensor | None
    weights: torch.Tensor | None
    loss_mask: torch.Tensor
    ref_logp: torch.Tensor | None
    metrics: dict
    row_weights: torch.Tensor | None = None  # [B] (plug-in loss weights)
    kl_coefs: torch.Tensor | None = None  # [B]
    fused: bool = False
    rollout_logp: torch.Tensor | None = None  # fused only: π_sparse
    response_mask: torch.Tensor | None = None  # fused only: before rejection and over-long drops
    correction: CorrectionConfig | None = None  # fused only
    fused_step: object = None  # fused only: fused_old_logp.run_fused_update


@dataclasses.dataclass
class Corrected:
    """π_old and what the sparse-rollout correction makes of it, for the whole batch."""

    old_logp: torch.Tensor
    weights: torch.Tensor | None
    loss_mask: torch.Tensor
    metrics: dict


def trace_advantages(batch: RolloutBatch, adv_cfg: AdvantageConfig, mask: torch.Tensor
                     ) -> torch.Tensor:
    """[B, T] advantages: computed over traces within their groups, then given to every sample
    (LM call) of the trace."""
    rewards = batch.rewards.float()
    groups = dict(n_samples_per_prompt=batch.n_samples_per_prompt) if batch.group_index is None \
        else dict(group_index=_dense_labels(batch.group_index))
    if batch.trace_index is None:
        return advantages_for(adv_cfg, rewards, mask, **groups)
    if adv_cfg.estimator == "reinforce_plus_plus":
        raise ValueError("--advantage-estimator reinforce_plus_plus gives token-level returns and "
                         "cannot share one advantage over the calls of a trace; use a group estimator")
    per_trace = advantages_for(adv_cfg, rewards, torch.ones(len(rewards), 1, dtype=torch.bool),
                               **groups)
    return per_trace[batch.trace_of_sample(), 0][:, None] * mask


def _dense_labels(labels: list) -> list[int]:
    """Any hashable group labels -> 0..G-1 in order of first appearance."""
    ids: dict = {}
    return [ids.setdefault(label, len(ids)) for label in labels]


def _optional_rows(values: list[float] | None) -> torch.Tensor | None:
    return None if values is None else torch.tensor(values, dtype=torch.float32)


def prepare_update(trainer, batch: RolloutBatch, adv_cfg: AdvantageConfig,
                   corr_cfg: CorrectionConfig | None, ref_logp: list[torch.Tensor] | None = None,
                   plan=None) -> PreparedUpdate:
    """Advantages, π_old and the correction; ``plan`` (``fused_old_logp.plan_old_logp``): when
    it fuses, π_old and the correction are left to the update's own forward."""
    width = max(len(s.response_ids) for s in batch.samples)
    mask = response_mask(batch.samples, width)
    rollout = pad_rows(batch.rollout_logp, width)
    advantages = trace_advantages(batch, adv_cfg, mask)
    ref = pad_rows(ref_logp, width) if ref_logp is not None else None
    rows = dict(row_weights=_optional_rows(batch.loss_weights),
                kl_coefs=_optional_rows(batch.kl_coefs))
    metrics = dict(plan.metrics) if plan is not None else {}
    if plan is not None and plan.fused:
        return PreparedUpdate(advantages, None, None, _kept(mask, batch.keep), ref, metrics, **rows,
                              fused=True, rollout_logp=rollout, response_mask=mask,
                              correction=corr_cfg, fused_step=plan.step)
    old = None
    if corr_cfg is None or corr_cfg.needs_dense_recompute:
        sparse = trainer.train_cfg.sparse_recompute  # the sampler's own attention, replayed
        old = pad_rows(gather_dp(trainer.compute_logprobs(batch.samples, sparse=sparse), trainer),
                       width)
    done = apply_correction(old, rollout, mask, batch.keep, corr_cfg, batch.dense)
    return PreparedUpdate(advantages, done.old_logp, done.weights, done.loss_mask, ref,
                          {**metrics, **done.metrics}, **rows)


def apply_correction(old: torch.Tensor | None, rollout: torch.Tensor, mask: torch.Tensor,
                     keep: torch.Tensor | None, corr_cfg: CorrectionConfig | None,
                     dense: torch.Tensor | None = None) -> Corrected:
    """The correction over the whole batch once π_old is known (before the update, or, fused,
    after its forward: the same function, so the same metrics and mask)."""
    metrics = {}
    if corr_cfg is not None:
        old = select_old_logp(old, rollout, corr_cfg)
        mis = correct_with_dense_rows(old, rollout, mask, dense, corr_cfg)
        weights, loss_mask, metrics = mis.weights, mis.loss_mask, dict(mis.metrics)
    else:
        weights, loss_mask = None, mask
    metrics.update(_logprob_diffs(old, rollout, mask, dense))
    return Corrected(old, weights, _kept(loss_mask, keep), metrics)


def _kept(loss_mask: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Dropped rows (over-long filtering) still count as sequences, like rejected ones."""
    return loss_mask if keep is None else loss_mask & keep.bool()[:, None]


def _logprob_diffs(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor,
                   dense: torch.Tensor | None) -> dict:
    """How far the sparse sampler is from the dense policy (always logged), over the sparse
    samples' tokens; with dense share also over the dense ones (numerics only: ~0)."""
    diff = old - rollout
    out = {"train_rollout_logprob_abs_diff": _mean_abs(diff, sparse_rows_mask(mask, dense))}
    if dense is not None:
        out["train_rollout_logprob_abs_diff_dense"] = _mean_abs(diff, mask & dense.bool()[:, None])
    return out


def _mean_abs(x: torch.Tensor, mask: torch.Tensor) -> float:
    with torch.no_grad():
        picked = x[mask]
        return float(picked.abs().mean()) if picked.numel() else 0.0


def mismatch_inputs(batch: RolloutBatch, prep: PreparedUpdate):
    """(π_dense, π_sampler, mask of the sparse samples' response tokens), each [B, T]: what
    the adaptive budget measures after the recompute."""
    width = prep.old_logp.shape[1]
    mask = sparse_rows_mask(response_mask(batch.samples, width), batch.dense)
    return prep.old_logp, pad_rows(batch.rollout_logp, width), mask


@dataclasses.dataclass
class GRPOLoss:
    """The per-micro-batch loss for ``PolicyTrainer.train_step``: a ``RowLoss``, so the
    micro-batch comes as zero-padded rows ``[n, width]`` (one gather) with its sample ids
    already on the device (copied with the pack): no per-sample work, no copy of its own."""

    prep: PreparedUpdate  # on the device (prep_on_device); a host one is picked on the host
    loss_cfg: PolicyLossConfig
    scale: LossScale

    @property
    def row_width(self) -> int:
        return self.prep.advantages.shape[1]

    def __call__(self, rows: ResponseRows):
        prep, device = self.prep, rows.logp.device
        ids = rows.ids_device
        if ids.device != prep.advantages.device:  # a prep left on the host (tests): pick there
            ids = torch.tensor(rows.ids, device=prep.advantages.device)
        pick = lambda t: None if t is None else t[ids].to(device)  # noqa: E731
        old, weights, loss_mask = _anchor(prep, rows.logp, pick)
        return policy_loss(rows.logp, old, pick(prep.advantages), loss_mask, self.loss_cfg,
                           mis_weights=weights, ref_logp=pick(prep.ref_logp),
                           entropy=rows.entropy, loss_scale=self.scale,
                           row_weights=pick(prep.row_weights), kl_coefs=pick(prep.kl_coefs))


def make_loss_fn(prep: PreparedUpdate, loss_cfg: PolicyLossConfig, scale: LossScale
                 ) -> GRPOLoss:
    """The per-micro-batch loss for ``PolicyTrainer.train_step`` (rows picked by sample id)."""
    return GRPOLoss(prep, loss_cfg, scale)


def _anchor(prep: PreparedUpdate, logp: torch.Tensor, pick):
    """π_old, correction weights and loss mask of a micro-batch's rows. Fused, π_old is this very
    forward (detached) and the rows correct themselves: IS weights, rejection and veto are per
    token or per sequence, so they equal the whole batch's; only the normaliser is left out
    (the step scales the gradient by it, ``fused_old_logp.AfterForward``)."""
    if not prep.fused:
        return pick(prep.old_logp), pick(prep.weights), pick(prep.loss_mask)
    old = logp.detach()
    if prep.correction is None:
        return old, None, pick(prep.loss_mask)
    weights, loss_mask = row_correction(old, pick(prep.rollout_logp), pick(prep.response_mask),
                                        prep.correction)
    return old, weights, loss_mask & pick(prep.loss_mask)


def step_bounds(batch: RolloutBatch, global_batch_size: int) -> list[tuple[int, int]]:
    """Sample ranges of the optimizer steps: ``num_traces // global_batch_size`` steps of
    (nearly) equal numbers of traces, cut at trace boundaries (a trace's calls are never split
    over two steps). A plug-in's rollout may hold any number of traces."""
    n = batch.num_traces
    if global_batch_size <= 0:
        raise ValueError(f"--global-batch-size must be positive, got {global_batch_size}")
    steps = max(1, n // global_batch_size)
    first_sample = _first_sample_of_traces(batch) + [len(batch.samples)]
    cuts = [first_sample[(n * k) // steps] for k in range(steps + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _first_sample_of_traces(batch: RolloutBatch) -> list[int]:
    traces = batch.trace_of_sample().tolist()
    if traces != sorted(traces):
        raise ValueError("the calls of a trace must be contiguous and traces in order")
    first: dict[int, int] = {}
    for i, t in enumerate(traces):
        first.setdefault(t, i)
    return [first[t] for t in range(batch.num_traces)]


def run_updates(trainer, batch: RolloutBatch, prep: PreparedUpdate, loss_cfg: PolicyLossConfig,
                global_batch_size: int) -> list[dict]:
    """Optimizer steps over consecutive global batches of the rollout; one metrics dict each."""
    if prep.fused:  # π_old from this step's own forward
        return [prep.fused_step(trainer, batch, prep, loss_cfg)]
    history = []
    for start, stop in step_bounds(batch, global_batch_size):
        sub = batch.samples[start:stop]
        sub_prep = _map_tensors(prep, lambda t: t[start:stop])
        scale = LossScale.for_batch(sub_prep.loss_mask, row_weights=sub_prep.row_weights)
        sub_prep = prep_on_device(sub_prep)  # once per global batch, not per micro-batch
        metrics = trainer.train_step(sub, make_loss_fn(sub_prep, loss_cfg, scale),
                                     with_entropy=loss_cfg.entropy_coef != 0,
                                     sparse=trainer.train_cfg.train_sparse_policy)
        history.append(_reduce_over_dp(metrics, trainer))
    return history


def prep_on_device(prep: PreparedUpdate) -> PreparedUpdate:
    """``prep``'s per-row tensors on this rank's device, in one pinned non-blocking copy."""
    names = [f.name for f in dataclasses.fields(prep)
             if isinstance(getattr(prep, f.name), torch.Tensor)]
    moved = to_device_together([getattr(prep, n) for n in names], default_device())
    return dataclasses.replace(prep, **dict(zip(names, moved)))


def _map_tensors(prep: PreparedUpdate, fn) -> PreparedUpdate:
    """``prep`` with ``fn`` applied to each of its per-row tensors (None fields stay None)."""
    return dataclasses.replace(prep, **{
        f.name: fn(getattr(prep, f.name)) for f in dataclasses.fields(prep)
        if isinstance(getattr(prep, f.name), torch.Tensor)})


def _reduce_over_dp(metrics: dict, trainer) -> dict:
    """Loss metrics are partial sums of globally-normalised terms: add them over DP ranks."""
    per_step = {"grad_norm", "lr", "update_skipped"}
    summed = {k: v for k, v in metrics.items() if k not in per_step}
    if trainer.dp_size > 1 and summed:
        keys = sorted(summed)
        # on the collective's device: NCCL has no CPU tensors
        t = torch.tensor([summed[k] for k in keys], dtype=torch.float64,
                         device=default_device())
        dist.all_reduce(t, group=trainer.dp_group)
        summed = dict(zip(keys, t.tolist()))
    out = defaultdict(float, summed)
    out.update({k: metrics[k] for k in per_step if k in metrics})
    return dict(out)
