"""π_old from the update's own forward: no second forward pass over an on-policy rollout.

π_old is the policy's weights before the update. When a rollout is trained by exactly one
optimizer step (global batch = rollout), π_old is what the update's own forward computes: its
log-probs, detached, are π_old, and the recompute that ``prepare_update`` runs first is a wasted
forward over the whole batch. The fused step (``run_fused_update``) takes them from there:

- per micro-batch, the PPO ratio anchors on the forward's own log-probs (ratio 1, gradient of the
  ratio as before) and the rows correct themselves (IS weights, rejection, veto are per token or
  per sequence: ``correction.row_correction``);
- after the last backward, before the optimizer, the whole batch's π_old is known: the correction
  runs over it exactly as before the update (the same function: same metrics, same loss mask),
  and the two batch-wide scalars a micro-batch could not know scale the accumulated gradient --
  the weights' batch normaliser (the loss is linear in the weights) and, for ``token_mean``, the
  loss-mask token count after rejection (every term is divided by it).

The recompute stays where the fused step would not be exact or not be π_old
(``recompute_reason``): several optimizer steps per rollout (π_old is the weights before the first
step only), async staleness >= 1 (kept as the off-policy case, as issue #42 asks, though π_old
is the trainer's current weights there too and the fused step would be exact),
``--sparse-recompute`` without ``--train-sparse-policy`` (π_old replays the engine's evictions,
the update's forward is dense: another function of the weights), batch-normalised weights with a
KL or entropy term (the normaliser scales only the policy-gradient term and the accumulated
gradient mixes it with the others: no single factor, and splitting them takes a second
backward), and ``--no-fused-old-logprobs``. Bypass needs no π_old forward at all.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from evaluation.progress import write

from ..algorithms import LossScale, PolicyLossConfig
from .grpo_update import (PreparedUpdate, RolloutBatch, _reduce_over_dp, apply_correction,
                          gather_dp, make_loss_fn, pad_rows, prep_on_device, step_bounds)

FUSED_REASON = ("the rollout is on-policy and trained in one optimizer step, so the weights "
                "before that step are π_old")
_PER_STEP = {"grad_norm", "lr", "update_skipped"}  # not loss terms: never rescaled
_POLICY_TERMS = {"loss", "pg_loss"}  # the terms the IS weights multiply


@dataclasses.dataclass(frozen=True)
class OldLogpPlan:
    """Where this rollout's π_old comes from, and why."""

    fused: bool
    reason: str

    @property
    def metrics(self) -> dict:
        return {"old_logp_fused": float(self.fused)}

    @property
    def step(self):
        """The fused update, handed to ``grpo_update.run_updates`` through the prepared update
        (grpo_update does not import this module: that would be a cycle)."""
        return run_fused_update


def plan_old_logp(train_cfg, batch: RolloutBatch, algo, global_batch_size: int,
                  max_staleness: int | None = None) -> OldLogpPlan:
    """The fused step where it equals the recompute-then-update path; announced when it changes.
    ``algo``: an ``AlgorithmConfig`` (its ``loss`` and ``correction``)."""
    why = recompute_reason(train_cfg, batch, algo.loss, algo.correction, global_batch_size,
                           max_staleness)
    plan = OldLogpPlan(why is None, why or FUSED_REASON)
    _announce(plan)
    return plan


def recompute_reason(train_cfg, batch: RolloutBatch, loss_cfg: PolicyLossConfig, corr_cfg,
                     global_batch_size: int, max_staleness: int | None = None) -> str | None:
    """Why π_old needs its own forward for this rollout (None: the update's forward is π_old)."""
    if not train_cfg.fused_old_logprobs:
        return "--no-fused-old-logprobs"
    if corr_cfg is not None and not corr_cfg.needs_dense_recompute:
        return "bypass: π_old is π_sparse, no forward to save"
    if max_staleness:
        return f"--max-staleness {max_staleness}: off-policy"
    if getattr(batch, "dense", None) is not None and bool(batch.dense.any()):
        return ("--n-dense-samples-per-prompt: a micro-batch's per-row correction does not tell "
                "the dense rows apart")
    if len(step_bounds(batch, global_batch_size)) > 1:
        return "several optimizer steps per rollout: π_old is the weights before the first only"
    if train_cfg.sparse_recompute != train_cfg.train_sparse_policy:
        return ("--sparse-recompute without --train-sparse-policy: π_old replays the evictions, "
                "the update's forward is dense")
    if corr_cfg is not None and corr_cfg.needs_batch_normalizer and \
            _has_other_terms(loss_cfg, batch.kl_coefs):
        return ("batch-normalised IS weights with a KL or entropy term: the normaliser scales "
                "only the policy-gradient part of the accumulated gradient")
    return None


def _has_other_terms(loss_cfg: PolicyLossConfig, kl_coefs) -> bool:
    """Loss terms besides the IS-weighted policy gradient (per-row KL coefficients count)."""
    row_kl = kl_coefs is not None and any(float(c) != 0 for c in kl_coefs)
    return loss_cfg.kl_loss_coef != 0 or loss_cfg.entropy_coef != 0 or row_kl


_announced: set[OldLogpPlan] = set()


def _announce(plan: OldLogpPlan) -> None:
    """One line (rank 0) the first time a rollout takes each path."""
    if plan in _announced or (dist.is_initialized() and dist.get_rank() != 0):
        return
    _announced.add(plan)
    how = "from the update's forward (fused)" if plan.fused else "recomputed before the update"
    write(f"π_old {how}: {plan.reason}")  # whole, above the rollouts bar


@dataclasses.dataclass
class AfterForward:
    """``train_step``'s ``before_step``: the whole batch's correction once its π_old is known,
    and the factors that make the accumulated gradient and the loss metrics exact."""

    trainer: object
    keep: torch.Tensor | None
    prep: PreparedUpdate  # on the host; its old_logp, weights, loss_mask, metrics are filled
    loss_cfg: PolicyLossConfig
    provisional: LossScale  # what the micro-batches divided by
    token_factor: float = 1.0  # every loss term
    policy_factor: float = 1.0  # the IS-weighted terms (loss = pg_loss when it differs)

    def __call__(self, local_logp: list[torch.Tensor | None]) -> float:
        prep = self.prep
        old = pad_rows(gather_dp(local_logp, self.trainer), prep.advantages.shape[1])
        done = apply_correction(old, prep.rollout_logp, prep.response_mask, self.keep,
                                prep.correction)
        prep.old_logp, prep.weights, prep.loss_mask = done.old_logp, done.weights, done.loss_mask
        prep.metrics.update(done.metrics)
        self.token_factor = self._token_factor(done.loss_mask)
        self.policy_factor = self.token_factor / self._normaliser(done.metrics)
        return self.policy_factor

    def _token_factor(self, loss_mask: torch.Tensor) -> float:
        """token_mean divides by the loss-mask tokens after rejection; the micro-batches used
        the count before it. (All rejected: no gradient either way, metrics 0, not 0/0.)"""
        if self.loss_cfg.loss_agg_mode != "token_mean":
            return 1.0
        exact = LossScale.for_batch(loss_mask, row_weights=self.prep.row_weights).num_tokens
        return self.provisional.num_tokens / exact if exact else 0.0

    def _normaliser(self, metrics: dict) -> float:
        corr = self.prep.correction
        return metrics["batch_norm_factor"] if corr is not None and corr.needs_batch_normalizer \
            else 1.0

    def rescale(self, metrics: dict) -> dict:
        """The step's loss metrics as the exact denominators would have given them."""
        return {k: v if k in _PER_STEP else v * self._factor(k) for k, v in metrics.items()}

    def _factor(self, key: str) -> float:
        return self.policy_factor if key in _POLICY_TERMS else self.token_factor


def run_fused_update(trainer, batch: RolloutBatch, prep: PreparedUpdate,
                     loss_cfg: PolicyLossConfig) -> dict:
    """The rollout's one optimizer step with π_old from its own forward; its metrics."""
    corr = prep.correction
    if corr is not None and corr.needs_batch_normalizer and _has_other_terms(loss_cfg,
                                                                             prep.kl_coefs):
        raise ValueError("fused π_old with batch-normalised weights needs a policy-gradient-only "
                         "loss (plan_old_logp keeps the recompute here)")
    provisional = LossScale.for_batch(prep.loss_mask, row_weights=prep.row_weights)
    after = AfterForward(trainer, batch.keep, prep, loss_cfg, provisional)
    on_device = prep_on_device(prep)
    metrics = trainer.train_step(batch.samples, make_loss_fn(on_device, loss_cfg, provisional),
                                 with_entropy=loss_cfg.entropy_coef != 0,
                                 sparse=trainer.train_cfg.train_sparse_policy, before_step=after)
    return _reduce_over_dp(after.rescale(metrics), trainer)
