"""Token sampling and the logprobs reported with each sampled token.

Which logprob is returned (the behaviour policy a trainer corrects against):
    logprob = log_softmax(logits / T)[token]          (T = 1 when temperature == 0)
over the FULL vocabulary, i.e. after temperature but BEFORE top-k / top-p / min-p truncation.
The exceptions are `logit_bias`, added to the logits first (as SGLang, the reported log-probs are
those of the biased distribution actually sampled from), and `min_new_tokens`: until it is
reached, stop/EOS tokens are set to -inf before everything, for the same reason.

Randomness is counter-based: a request's draw at output position i is a hash of
(seed, i), turned into one uniform u in (0, 1) and inverted through the CDF of the (filtered)
distribution. A seeded request therefore samples the same tokens whatever else is in the batch,
whatever the batch order, and after preemption and recompute.

Filtered rows walk the tokens by probability descending, ties by lower id. When every filtered
row has a top_k, the caller sets `k_max` (>= each of them) and only the k_max most probable
tokens are selected (two torch.topk passes, exact under ties) instead of sorting the whole
vocabulary every step; the tokens drawn are the full sort's.

The common RL step (no top-k / top-p / min-p, no top log-probs; greedy rows allowed) runs as two
Triton kernels on CUDA (layers/sampling_kernels.py): the logits are read once, in their dtype, with
no fp32 [B, V] copies. Same semantics; the CDF is summed in another order, so a drawn token can
differ from this torch path's only when u * total lies within float rounding of a CDF boundary
(~1e-6 of the total); log-probs agree to fp32 rounding, greedy ids exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.fused_ops import counter_uniform, row_argmax
from ..layers.sampling_kernels import fused_sampling_enabled, sample_full_vocab

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """32-bit avalanche hash on int64 tensors holding values < 2**32 (products stay < 2**63)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _M32
    return x ^ (x >> 16)


def uniform_from_counter(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One float64 in (0, 1) per (seed, step) pair; identical on CPU and CUDA (one Triton
    kernel there, fused_ops.counter_uniform, bit-equal to these torch ops)."""
    fused = counter_uniform(seeds, steps)
    if fused is not None:
        return fused
    h = _mix32(_mix32(seeds & _M32) ^ ((steps * 0x9E3779B9) & _M32))
    return (h.double() + 0.5) / 2.0 ** 32


@dataclass
class SamplingBatch:
    temperatures: torch.Tensor  # [B] float32, 0 = greedy
    top_p: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64, vocab size when off
    min_p: torch.Tensor  # [B] float32
    seeds: torch.Tensor  # [B] int64
    steps: torch.Tensor  # [B] int64, index of the output token being drawn
    all_greedy: bool
    need_filter: bool  # some row uses top-k / top-p / min-p
    need_logprobs: bool
    top_logprobs_num: int  # max over the batch
    ban_rows: torch.Tensor | None = None  # (row, token) pairs forced to -inf (min_new_tokens)
    ban_ids: torch.Tensor | None = None
    # logit_bias: (row, token) pairs and what is added to their logits, in fp32 (None: no bias)
    bias_rows: torch.Tensor | None = None
    bias_ids: torch.Tensor | None = None
    bias_values: torch.Tensor | None = None
    filtered: torch.Tensor | None = None  # [B] bool, rows using a filter (None: all, if need_filter)
    # Precomputed once per batch by the engine (each saves kernel launches every step):
    divisors: torch.Tensor | None = None  # [B] float32, temperature with 0 -> 1
    sampled: torch.Tensor | None = None  # [B] bool, temperature > 0
    # >= every filtered row's top_k (None: some filtered row has none): the filtered draw then
    # looks at the k_max most probable tokens instead of sorting the vocabulary
    k_max: int | None = None


@dataclass
class SampleOutput:
    ids: torch.Tensor  # [B]
    logprobs: torch.Tensor | None  # [B]
    top_values: torch.Tensor | None  # [B, k]
    top_ids: torch.Tensor | None


class Sampler:
    def __call__(self, logits: torch.Tensor, sb: SamplingBatch) -> SampleOutput:
        """`logits` [B, V] in the model dtype or fp32; softmaxes run in fp32."""
        if sb.bias_rows is not None:  # added in fp32: a bf16 sum would round the bias away
            logits = logits.float()
            logits[sb.bias_rows, sb.bias_ids] += sb.bias_values
        if sb.ban_rows is not None:
            logits[sb.ban_rows, sb.ban_ids] = float("-inf")
        if sb.all_greedy and not sb.need_logprobs:
            # the same index in the model dtype as after upcasting
            return SampleOutput(row_argmax(logits), None, None, None)
        if _fusable(sb) and fused_sampling_enabled(logits):
            return self._fused(logits, sb)
        greedy_ids = row_argmax(logits)
        logits = logits.float()
        if sb.all_greedy:
            ids, scaled = greedy_ids, logits
        else:
            sampled, temps = _row_modes(sb)
            scaled = logits / temps[:, None]
            ids = self._draw(scaled, sb)
            ids = torch.where(sampled, ids, greedy_ids)
        logprobs = top_v = top_i = None
        if sb.need_logprobs:
            lp = torch.log_softmax(scaled, dim=-1)
            logprobs = lp.gather(1, ids[:, None])[:, 0]
            if sb.top_logprobs_num > 0:
                top_v, top_i = lp.topk(sb.top_logprobs_num, dim=-1)
        return SampleOutput(ids, logprobs, top_v, top_i)

    @staticmethod
    def _fused(logits: torch.Tensor, sb: SamplingBatch) -> SampleOutput:
        sampled, temps = (None, None) if sb.all_greedy else _row_modes(sb)
        ids, logprobs = sample_full_vocab(logits, temps, sampled, sb.seeds, sb.steps,
                                          sb.need_logprobs)
        return SampleOutput(ids, logprobs, None, None)

    @staticmethod
    def _draw(scaled: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
        """Inverse-CDF draw. Rows without filters walk the CDF in vocabulary order, filtered rows
        in descending probability order; each row's order depends on its own parameters only,
        so a request's tokens never depend on whether a batch-mate uses a filter."""
        probs = torch.softmax(scaled, dim=-1)
        u = uniform_from_counter(sb.seeds, sb.steps).to(probs.dtype)
        if not sb.need_filter:
            return _inverse_cdf(probs, u)
        sorted_probs, order = _descending(probs, sb.k_max)
        rank = torch.arange(sorted_probs.shape[1], device=probs.device)[None, :]
        drop = rank >= sb.top_k[:, None]
        drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) > sb.top_p[:, None]
        drop |= sorted_probs < sb.min_p[:, None] * sorted_probs[:, :1]
        ids = order.gather(1, _inverse_cdf(sorted_probs.masked_fill(drop, 0.0), u)[:, None])[:, 0]
        if sb.filtered is None:
            return ids
        return torch.where(sb.filtered, ids, _inverse_cdf(probs, u))


def _descending(probs: torch.Tensor, k_max: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, token ids) in one total order: probability descending, ties by lower id
    first. Its first k columns never depend on k, so a row draws the same token whatever k_max
    its batch-mates set (past its own top_k every column is dropped, hence zero)."""
    if k_max is None or k_max >= probs.shape[1]:
        return probs.sort(dim=-1, descending=True, stable=True)
    ids = _first_k(probs, k_max).sort(dim=-1).values  # by id: the stable sort keeps ties so
    top, pos = probs.gather(1, ids).sort(dim=-1, descending=True, stable=True)
    return top, ids.gather(1, pos)


def _first_k(probs: torch.Tensor, k: int) -> torch.Tensor:
    """The ids of the order's first k tokens, without sorting the vocabulary. topk's k-th value
    is exact, but which of the tokens tied at it topk returns is not specified (bf16 logits tie
    often): all tokens above it are taken (fewer than k), then the lowest ids among the ties."""
    edge = probs.topk(k, dim=-1).values[:, -1:]
    neg_ids = -torch.arange(probs.shape[1], device=probs.device, dtype=probs.dtype)  # exact < 2**24
    key = torch.where(probs == edge, neg_ids, float("-inf"))
    key = torch.where(probs > edge, float("inf"), key)
    return key.topk(k, dim=-1).indices


def _fusable(sb: SamplingBatch) -> bool:
    """Steps the fused kernels serve: no top log-probs, and the sampled rows walk the CDF in
    vocabulary order (filtered rows sort it, which stays torch's)."""
    return sb.top_logprobs_num == 0 and (sb.all_greedy or not sb.need_filter)


def _row_modes(sb: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(sampled [B] bool, divisor [B]: temperature, 1 for greedy rows), precomputed or not."""
    sampled = sb.sampled if sb.sampled is not None else sb.temperatures > 0
    temps = sb.divisors if sb.divisors is not None else torch.where(
        sampled, sb.temperatures, torch.ones_like(sb.temperatures))
    return sampled, temps


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The first index whose cumulative (unnormalised) probability reaches u * total."""
    cdf = probs.cumsum(dim=-1)
    target = (u * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target).clamp_(max=probs.shape[1] - 1)[:, 0]
