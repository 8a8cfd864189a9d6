"""The Megatron-side learner: the policy (DDP-wrapped model, optimizer, LR schedule, built by
``policy_parts.py``), its train step and log-prob recompute.

Micro-batches are packed by a token budget (``max_tokens_per_gpu``) and run through Megatron's
forward-backward schedule (pipeline parallel when PP > 1). The loss of each micro-batch is
already normalised by *global* counts (tokens or sequences over the whole global batch, all DP
ranks included), so gradients simply add up over micro-batches and DP ranks: Megatron is told
to neither average over micro-batches nor over DP (``calculate_per_token_loss`` with our own
``finalize_model_grads`` that does not rescale).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Callable

import torch

from ..launch import default_device
from .forward import packed_forward
from .logprobs import logprobs_and_entropy
from .packing import (MicroBatches, PackedBatch, Sample, pack, packed_length,
                      split_by_token_budget)
from .policy_parts import build_policy_parts
from .settings import ModelConfig, OptimConfig, TrainConfig  # noqa: F401 - handed on
from .speed import SpeedMeter, forward_flops, model_parallel_size, train_flops
from .token_budget import resolve_max_tokens


# loss_fn(logp, entropy, sample_ids) -> (loss, metrics): logp/entropy are per-sample response
# tensors (pack order), sample_ids index the global batch; loss is globally normalised. A loss
# with a ``row_width`` attribute (a ``RowLoss``, e.g. grpo_update.GRPOLoss) is called with
# ``ResponseRows`` instead: the responses as zero-padded rows of that width.
LossFn = Callable[[list[torch.Tensor], list[torch.Tensor] | None, list[int]],
                  tuple[torch.Tensor, dict]]
# before_step(logp per sample, None where not this rank's) -> factor for the accumulated grads
BeforeStep = Callable[[list[torch.Tensor | None]], float]


@dataclasses.dataclass
class ResponseRows:
    """A micro-batch's responses for a ``RowLoss``: log-probs (and entropies) ``[n, width]``,
    sample i's in row i and zeros after it, and which samples of the global batch the rows are
    (``ids``; ``ids_device`` the same on the device, copied with the pack)."""

    logp: torch.Tensor
    entropy: torch.Tensor | None
    ids: list[int]
    ids_device: torch.Tensor


@dataclasses.dataclass
class MicroBatchResult:
    """What one micro-batch's forward leaves: its samples' response log-probs, detached, one
    flat tensor (pack order, ``lengths`` each), and its loss metrics (0-d device tensors)."""

    ids: list[int]
    lengths: list[int]
    logp: torch.Tensor
    metrics: dict


class PolicyTrainer:
    """One rank's view of the policy under training (call after ``init_model_parallel``)."""

    def __init__(self, model_cfg: ModelConfig, optim_cfg: OptimConfig, train_cfg: TrainConfig,
                 *, cache_dir: str | Path | None = None, load_weights: bool = True,
                 trainable: bool = True):
        from megatron.core import parallel_state as ps

        from .attention import SDPACoreAttention

        self.model_cfg, self.optim_cfg, self.train_cfg = model_cfg, optim_cfg, train_cfg
        SDPACoreAttention.sparse_impl = train_cfg.sparse_attention  # replay's, for every layer
        # model, DDP, optimizer and schedule in one pass down (policy_parts.py); frozen without
        parts = build_policy_parts(model_cfg, optim_cfg if trainable else None,
                                   cache_dir=cache_dir, load_weights=load_weights)
        self.arch, self.model, self.config = parts.arch, parts.model, parts.config
        self.optimizer, self.scheduler = parts.optimizer, parts.scheduler
        self.dp_group = ps.get_data_parallel_group()
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.step = 0
        self.speed = SpeedMeter()  # per-phase tokens, FLOPs, seconds (learner/speed.py)

    # --- batching ----------------------------------------------------------------------------
    def _micro_batches(self, samples: list[Sample], ids: list[int], sparse: bool = False,
                       row_width: int | None = None) -> MicroBatches:
        if sparse:
            self._check_replay_attention()
        lengths = [packed_length(samples[i], sparse) for i in ids]
        groups = split_by_token_budget(lengths, self._max_tokens())
        device = default_device()
        # masks built on the device; within a rollout's shared_replay_masks (replay_cache.py)
        # the same micro-batch of another pass (reference, recompute, update) reuses them
        build = lambda g: pack(samples, g, sparse=sparse, device=device,  # noqa: E731
                               row_width=row_width).to(device)
        return MicroBatches([[ids[j] for j in g] for g in groups],
                            [sum(lengths[j] for j in g) for g in groups], build)

    def _max_tokens(self) -> int:
        """The micro-batch budget; left unset, sized from free memory at the first pass and
        kept in the config the reference shares (the passes of a rollout pack alike)."""
        if self.train_cfg.max_tokens_per_gpu is None:
            self.train_cfg.max_tokens_per_gpu = resolve_max_tokens(self)
        return self.train_cfg.max_tokens_per_gpu

    def _timed(self, phase: str, samples: list[Sample], ids: list[int], sparse: bool,
               flops_fn):
        """``speed.timed`` for a pass over this rank's samples, per GPU of its model-parallel
        group."""
        lengths = [packed_length(samples[i], sparse) for i in ids]
        share = model_parallel_size()
        return self.speed.timed(phase, sum(lengths) / share, flops_fn(self.arch, lengths) / share)

    def _check_replay_attention(self) -> None:
        """Eviction masks are applied by SDPACoreAttention only: any other core attention
        would silently recompute densely."""
        from .attention import SDPACoreAttention

        if not any(isinstance(m, SDPACoreAttention) for m in self.model.modules()):
            raise ValueError("eviction replay needs the sdpa attention backend (--attention-backend "
                             "sdpa); this model's core attention would ignore the masks")

    def local_sample_ids(self, n: int) -> list[int]:
        """This DP rank's share of a global batch of ``n`` samples (contiguous, balanced)."""
        per, extra = divmod(n, self.dp_size)
        start = self.dp_rank * per + min(self.dp_rank, extra)
        return list(range(start, start + per + (self.dp_rank < extra)))

    # --- forward / backward ------------------------------------------------------------------
    def _run(self, micro_batches: MicroBatches, loss_fn, *, forward_only: bool,
             with_entropy: bool):
        from megatron.core.pipeline_parallel import get_forward_backward_func

        results = []
        it = iter(micro_batches)

        def forward_step(data_iterator, model):
            batch = next(data_iterator)
            loss = partial(self._loss_on_logits, batch, loss_fn, results, with_entropy)
            return packed_forward(model, batch), loss

        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=it, model=[self.model],
            num_microbatches=len(micro_batches), seq_length=micro_batches.longest,
            micro_batch_size=1,
            forward_only=forward_only)
        return results

    def _loss_on_logits(self, batch: PackedBatch, loss_fn, results, with_entropy, output):
        """``loss_fn`` None: a forward for the log-probs alone (no loss, no kernel for one)."""
        logits = output.reshape(batch.tokens.shape[1], -1)
        logp, ent = logprobs_and_entropy(
            logits, batch.targets, temperature=self.train_cfg.temperature,
            vocab_size=self.arch.vocab_size, chunk_size=self.train_cfg.log_probs_chunk_size,
            with_entropy=with_entropy)
        flat = batch.response_values(logp)
        loss, metrics = _call_loss(loss_fn, batch, logp, ent, flat)
        results.append(MicroBatchResult(batch.sample_indices, batch.response_lengths,
                                        flat.detach(), metrics))
        # Megatron adds the token count to its total (ours: already normalised): one constant
        return loss, _constants(logp.device)[1], {}

    @torch.no_grad()
    def compute_logprobs(self, samples: list[Sample], sparse: bool = False
                         ) -> list[torch.Tensor | None]:
        """Response log-probs of this rank's samples under the current weights (π_old / π_ref);
        ``sparse``: attending as the rollout engine did (the samples' eviction records).

        Returns a list aligned with ``samples``: tensors for this DP rank's samples, on the last
        pipeline stage; None elsewhere.
        """
        ids = self.local_sample_ids(len(samples))
        phase = "old_logp" if self.optimizer is not None else "reference"
        with self._timed(phase, samples, ids, sparse, forward_flops):
            self.model.eval()
            results = self._run(self._micro_batches(samples, ids, sparse), None,
                                forward_only=True, with_entropy=False)
            self.model.train()
            return _per_sample_logps(results, len(samples))

    def _step(self, samples, ids, loss_fn, with_entropy, sparse, before_step):
        """Forward-backward over the micro-batches and the optimizer step."""
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        micro_batches = self._micro_batches(samples, ids, sparse, _row_width(loss_fn))
        results = self._run(micro_batches, loss_fn, forward_only=False,
                            with_entropy=with_entropy)
        if before_step is not None:
            factor = before_step(_per_sample_logps(results, len(samples)))
            if factor != 1.0:  # linear: the same as scaling every micro-batch's loss
                self.model.scale_gradients(factor)
        update_ok, grad_norm, _ = self.optimizer.step()
        if update_ok:
            self.scheduler.step(increment=1)
        self.step += 1
        return results, update_ok, grad_norm

    def train_step(self, samples: list[Sample], loss_fn: LossFn, *, with_entropy: bool = False,
                   sparse: bool = False, before_step: BeforeStep | None = None) -> dict:
        """One optimizer step on this rank's share of a global batch (``sparse``: the policy's
        forward attends under the samples' eviction records, --train-sparse-policy).

        ``before_step``, after every micro-batch's backward and before the optimizer: given the
        forward's log-probs (as ``compute_logprobs`` returns them), it returns a factor for the
        accumulated gradients (a batch-wide scalar the loss could not know per micro-batch)."""
        ids = self.local_sample_ids(len(samples))
        with self._timed("update", samples, ids, sparse, train_flops):
            results, update_ok, grad_norm = self._step(samples, ids, loss_fn, with_entropy,
                                                       sparse, before_step)
        metrics = _sum_metrics([r.metrics for r in results])
        metrics.update(grad_norm=float(grad_norm or 0.0),
                       lr=float(self.optimizer.param_groups[0]["lr"]),
                       update_skipped=float(not update_ok))
        return dict(metrics)


def _call_loss(loss_fn, batch: PackedBatch, logp: torch.Tensor, ent: torch.Tensor | None,
               flat: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The micro-batch's loss and metrics: rows for a ``RowLoss``, per-sample tensors for a
    ``LossFn`` (``flat``: the responses' log-probs), a constant zero without a loss."""
    if loss_fn is None:
        return _constants(logp.device)[0], {}
    if _row_width(loss_fn) is not None:
        ent_rows = batch.response_rows(ent) if ent is not None else None
        return loss_fn(ResponseRows(batch.response_rows(logp), ent_rows, batch.sample_indices,
                                    batch.sample_rows))
    per_ent = batch.split_per_sample(ent) if ent is not None else None
    return loss_fn(list(torch.split(flat, batch.response_lengths)), per_ent,
                   batch.sample_indices)


def _row_width(loss_fn) -> int | None:
    """The response-row width a ``RowLoss`` takes; None for a per-sample ``LossFn``."""
    return getattr(loss_fn, "row_width", None)


_CONSTANTS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(0.0, 1) on ``device``, made once: a forward-only pass's loss and the token count every
    micro-batch hands Megatron (which only reads them), instead of new ones per micro-batch."""
    if device not in _CONSTANTS:
        _CONSTANTS[device] = (torch.zeros((), device=device),
                              torch.ones((), device=device, dtype=torch.int))
    return _CONSTANTS[device]


def _per_sample_logps(results: list[MicroBatchResult], n: int) -> list[torch.Tensor | None]:
    """``_run``'s results as a list over the ``n`` samples: host fp32 rows for this rank's
    samples (on the last pipeline stage), None elsewhere."""
    out: list[torch.Tensor | None] = [None] * n
    order = [i for r in results for i in r.ids]
    for i, lp in zip(order, _to_host(results)):
        out[i] = lp
    return out


def _to_host(results: list[MicroBatchResult]) -> list[torch.Tensor]:
    """fp32 CPU copies of every sample's log-probs: one device-to-host copy (one sync) for all
    of them."""
    if not results:
        return []
    flat = torch.cat([r.logp.float() for r in results]).cpu()
    lengths = [n for r in results for n in r.lengths]
    return [x.clone() for x in torch.split(flat, lengths)]  # own storage each


def _sum_metrics(per_micro_batch: list[dict]) -> dict:
    """Sum each metric over the micro-batches, in order, as Python floats; the tensor values
    (0-d, on the device) come back in one copy instead of one sync per value."""
    keys = [(k, v) for m in per_micro_batch for k, v in m.items()]
    tensors = [v for _, v in keys if torch.is_tensor(v)]
    device = tensors[0].device if tensors else None
    host = iter(torch.stack([t.detach().reshape(()).to(device, torch.float64) for t in tensors]
                            ).tolist() if tensors else [])
    metrics = defaultdict(float)
    for k, v in keys:
        metrics[k] += next(host) if torch.is_tensor(v) else float(v)
    return metrics
