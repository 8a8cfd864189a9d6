"""Log-probs and entropy of target tokens from (vocab-parallel) logits, in token chunks.

Logits of an 8k-token micro-batch over a 152k vocab are 2.5 GB in bf16 and twice that in fp32.
``ChunkedLogProbs`` is one autograd node over the whole logits tensor:

* forward walks the tokens ``chunk_size`` at a time and keeps only per-token statistics
  (log-normaliser, entropy), so an fp32 copy of the logits never exists beyond one chunk;
* backward writes each chunk's analytic gradient straight into one preallocated gradient tensor.

Per-chunk autograd (slicing + checkpointing) would instead make every chunk's backward
materialise a zero-filled gradient of the *whole* logits and add them up: traffic that grows
with chunks x tokens (it was ~10% of a train step on the 0.5B shape and made larger
micro-batches slower).

Under tensor parallelism each rank holds a vocab slice. The per-slice statistics are combined
across the TP group in the forward; the gradient of a slice needs no communication (the
softmax probabilities only depend on the global normaliser, already known).
"""

from __future__ import annotations

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


_kernels: dict[str, object] = {}


def _kernel(name: str):
    """The chunk functions, compiled on CUDA: each becomes one fused pass over the
    ``[chunk, vocab]`` tile instead of ~10 elementwise ones through fp32 temporaries."""
    fn = {"stats": _chunk_stats, "grad": _chunk_grad}[name]
    if not torch.cuda.is_available():
        return fn
    if name not in _kernels:
        _kernels[name] = torch.compile(fn, dynamic=True)
    return _kernels[name]


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
        stats = _kernel("stats")
        lse, entropy = [], []
        logp = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], chunk_size):
            end = start + chunk_size
            m, s0, s1, target = stats(logits[start:end], targets[start:end], temperature,
                                      vocab_start, vocab_size)
            if tp > 1:
                m, s0, s1, target = _combine_across_tp(m, s0, s1, target, group)
            chunk_lse = m + s0.log()
            logp[start:end] = target - chunk_lse
            lse.append(chunk_lse)
            entropy.append(chunk_lse - s1 / s0)
        lse, entropy = torch.cat(lse), torch.cat(entropy)
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.args = (temperature, vocab_start, vocab_size, chunk_size)
        ctx.with_entropy = with_entropy
        return logp, entropy if with_entropy else torch.zeros_like(logp)

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, targets, lse, entropy = ctx.saved_tensors
        temperature, vocab_start, vocab_size, chunk_size = ctx.args
        if grad_logp is None:
            grad_logp = torch.zeros_like(lse)
        if not ctx.with_entropy:
            grad_entropy = None
        grad_fn = _kernel("grad")
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], chunk_size):
            end = start + chunk_size
            grad[start:end] = grad_fn(
                logits[start:end], targets[start:end], lse[start:end], entropy[start:end],
                grad_logp[start:end],
                None if grad_entropy is None else grad_entropy[start:end],
                temperature, vocab_start, vocab_size)
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
