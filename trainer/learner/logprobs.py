"""Log-probs and entropy of target tokens from (vocab-parallel) logits, in token chunks.

Logits of an 8k-token micro-batch over a 152k vocab are 2.5 GB in bf16 and twice that in fp32.
``ChunkedLogProbs`` is one autograd node over the whole logits tensor:

* forward keeps only per-token statistics (log-normaliser, entropy);
* backward writes the analytic gradient straight into one gradient tensor.

On CUDA each direction is one Triton pass over the bf16 logits (``fusions.logprob_triton``);
elsewhere the torch functions below (the reference for those kernels) walk the tokens
``chunk_size`` at a time, so an fp32 copy of the logits never exists beyond one chunk.

Per-chunk autograd (slicing + checkpointing) would instead make every chunk's backward
materialise a zero-filled gradient of the *whole* logits and add them up: traffic that grows
with chunks x tokens (it was ~10% of a train step on the 0.5B shape and made larger
micro-batches slower).

Under tensor parallelism each rank holds a vocab slice. The per-slice statistics are combined
across the TP group in the forward; the gradient of a slice needs no communication (the
softmax probabilities only depend on the global normaliser, already known).
"""

from __future__ import annotations

import functools
import importlib.util

import torch
import torch.distributed as dist


def _tp_group():
    """(world size, rank, group) of the tensor-parallel group; (1, 0, None) without Megatron."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 1, 0, None
    return (ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
            ps.get_tensor_model_parallel_group())


def _scaled_logits(logits, temperature: float, vocab_start: int, vocab_size: int | None):
    """fp32 ``logits / temperature`` with Megatron's vocab padding set to -inf (not tokens)."""
    z = logits.float() / temperature
    if vocab_size is not None and vocab_start + z.shape[-1] > vocab_size:
        column = torch.arange(vocab_start, vocab_start + z.shape[-1], device=z.device)
        z = z.masked_fill(column >= vocab_size, float("-inf"))
    return z


def _chunk_stats(logits, targets, temperature: float, vocab_start: int, vocab_size: int | None):
    """Per-token statistics of this rank's vocab slice: the max ``m``, ``sum exp(z - m)``,
    ``sum exp(z - m) * z`` and the target's logit (0 when the target is another rank's)."""
    z = _scaled_logits(logits, temperature, vocab_start, vocab_size)
    m = z.max(dim=-1).values
    e = (z - m.unsqueeze(-1)).exp()
    s0 = e.sum(-1)
    s1 = torch.where(e > 0, e * z, 0.0).sum(-1)  # 0 * -inf on padded columns -> 0
    local = targets - vocab_start
    in_range = (local >= 0) & (local < z.shape[-1])
    target = z.gather(-1, local.clamp(0, z.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    return m, s0, s1, torch.where(in_range, target, 0.0)


def _chunk_grad(logits, targets, lse, entropy, grad_logp, grad_entropy, temperature: float,
                vocab_start: int, vocab_size: int | None):
    """d(loss)/d(logits) of one chunk of this rank's slice, in the logits' dtype.

    With p = softmax(z), z = logits / T: d logp / dz = onehot - p and
    d H / dz = -p * (log p + H)."""
    z = _scaled_logits(logits, temperature, vocab_start, vocab_size)
    log_p = z - lse.unsqueeze(-1)
    p = log_p.exp()
    grad = -p * grad_logp.unsqueeze(-1)
    if grad_entropy is not None:
        dh = -p * (log_p + entropy.unsqueeze(-1))
        grad = grad + torch.where(p > 0, dh, 0.0) * grad_entropy.unsqueeze(-1)
    local = targets - vocab_start
    in_range = (local >= 0) & (local < z.shape[-1])
    column = torch.arange(z.shape[-1], device=z.device)
    onehot = (column == local.unsqueeze(-1)) & in_range.unsqueeze(-1)
    grad = grad + torch.where(onehot, grad_logp.unsqueeze(-1), 0.0)
    return (grad / temperature).to(logits.dtype)


def _use_triton(logits: torch.Tensor) -> bool:
    return logits.is_cuda and _triton_installed()


@functools.lru_cache(maxsize=None)
def _triton_installed() -> bool:
    # asked once: a failed import is retried (a sys.path scan) on every call, twice per
    # micro-batch, otherwise
    return importlib.util.find_spec("triton") is not None


def _row_stats(logits, targets, temperature, vocab_start, vocab_size, chunk_size):
    """(max, sum exp, sum exp * z, target logit) per row of this rank's slice: one Triton pass
    on CUDA, otherwise torch in chunks of ``chunk_size`` rows."""
    if _use_triton(logits):
        from .fusions.logprob_triton import row_stats

        return row_stats(logits, targets, temperature, vocab_start, vocab_size)
    parts = [_chunk_stats(logits[i:i + chunk_size], targets[i:i + chunk_size], temperature,
                          vocab_start, vocab_size)
             for i in range(0, max(logits.shape[0], 1), chunk_size)]
    return tuple(torch.cat(column) for column in zip(*parts))


def _logits_grad(logits, targets, lse, entropy, grad_logp, grad_entropy, temperature,
                 vocab_start, vocab_size, chunk_size):
    if _use_triton(logits):
        from .fusions.logprob_triton import logits_grad

        return logits_grad(logits, targets, lse, entropy, grad_logp, grad_entropy, temperature,
                           vocab_start, vocab_size)
    grad = torch.empty_like(logits)
    for i in range(0, logits.shape[0], chunk_size):
        rows = slice(i, i + chunk_size)
        grad[rows] = _chunk_grad(logits[rows], targets[rows], lse[rows], entropy[rows],
                                 grad_logp[rows], None if grad_entropy is None else grad_entropy[rows],
                                 temperature, vocab_start, vocab_size)
    return grad


def _combine_across_tp(m, s0, s1, target, group):
    """Per-slice (max, sums, target logit) -> global ones, as if the vocab were whole."""
    m_global = m.clone()
    dist.all_reduce(m_global, op=dist.ReduceOp.MAX, group=group)
    scale = (m - m_global).exp()
    sums = torch.stack([s0 * scale, s1 * scale, target])
    dist.all_reduce(sums, group=group)
    return m_global, sums[0], sums[1], sums[2]


class ChunkedLogProbs(torch.autograd.Function):
    """``logits [T, V_local]`` -> fp32 ``(logp [T], entropy [T])`` (see the module docstring)."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, vocab_size, chunk_size, with_entropy):
        tp, rank, group = _tp_group()
        vocab_start = rank * logits.shape[-1]
        m, s0, s1, target = _row_stats(logits, targets, temperature, vocab_start, vocab_size,
                                       chunk_size)
        if tp > 1:
            m, s0, s1, target = _combine_across_tp(m, s0, s1, target, group)
        lse = m + s0.log()
        entropy = lse - s1 / s0
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.args = (temperature, vocab_start, vocab_size, chunk_size)
        ctx.with_entropy = with_entropy
        return target - lse, entropy if with_entropy else torch.zeros_like(lse)

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, targets, lse, entropy = ctx.saved_tensors
        temperature, vocab_start, vocab_size, chunk_size = ctx.args
        grad = _logits_grad(logits, targets, lse, entropy, grad_logp,
                            grad_entropy if ctx.with_entropy else None, temperature, vocab_start,
                            vocab_size, chunk_size)
        return grad, None, None, None, None, None


def logprobs_and_entropy(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                         vocab_size: int | None = None, chunk_size: int = 1024,
                         with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits [T, V_local]`` (this rank's vocab slice), ``targets [T]`` (global ids) ->
    fp32 ``logp [T]`` of log_softmax(logits / temperature) at the targets, and entropy ``[T]``.

    ``vocab_size`` is the real (unpadded) vocabulary: columns beyond it are excluded."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    if chunk_size <= 0:
        raise ValueError("chunk_size must be positive")
    logp, entropy = ChunkedLogProbs.apply(logits, targets, float(temperature), vocab_size,
                                          int(chunk_size), bool(with_entropy))
    return logp, (entropy if with_entropy else None)
